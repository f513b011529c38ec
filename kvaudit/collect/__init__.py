"""Collectors: what kvaudit reads from a GPU host (over SSH, on the host itself, or from a capture)."""
