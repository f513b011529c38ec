"""The engines' log grammars: lines -> startups and their events (one module per engine)."""
