"""Generate a realistic large SGLang journal: a real startup, then mostly decode-batch, prefill and HTTP lines
(what a server's log is made of after a few days), with a restart in the middle."""

from __future__ import annotations

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STARTUP = (ROOT / "fixtures" / "journal_logs" / "kimi-k25-sglang-0.5.9-tp8-eagle3.log").read_bytes()


def filler_block(seed: int, size: int) -> bytes:
    rnd = random.Random(seed)
    out: list[str] = []
    n = 0
    sec = 0
    while n < size:
        sec += 1
        ts = f"2026-02-25T{10 + sec // 3600 % 14:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}+0000"
        pid = 48211 + rnd.randrange(8)
        k = rnd.random()
        if k < 0.55:
            msg = (f"[2026-02-25 10:21:40 TP0] Decode batch, #running-req: {rnd.randrange(1, 48)}, "
                   f"#token: {rnd.randrange(1000, 159000)}, token usage: {rnd.random():.2f}, accept len: "
                   f"{rnd.uniform(1, 4):.2f}, accept rate: {rnd.random():.2f}, cuda graph: True, gen throughput "
                   f"(token/s): {rnd.uniform(100, 2000):.2f}, #queue-req: {rnd.randrange(5)}, ")
        elif k < 0.75:
            msg = (f"[2026-02-25 10:21:40 TP0] Prefill batch, #new-seq: {rnd.randrange(1, 8)}, #new-token: "
                   f"{rnd.randrange(1, 8192)}, #cached-token: {rnd.randrange(0, 60000)}, token usage: "
                   f"{rnd.random():.2f}, #running-req: {rnd.randrange(48)}, #queue-req: {rnd.randrange(5)}, ")
        else:
            path = rnd.choice(["/v1/chat/completions", "/health", "/v1/completions", "/metrics"])
            msg = (f'[2026-02-25 10:21:41] INFO:     10.0.{rnd.randrange(256)}.{rnd.randrange(256)}:'
                   f'{rnd.randrange(30000, 60000)} - "POST {path} HTTP/1.1" 200 OK')
        line = f"{ts} gpu-node-07 python3[{pid}]: {msg}\n"
        out.append(line)
        n += len(line)
    return "".join(out).encode()


def generate(path: Path, size: int) -> Path:
    if path.exists() and path.stat().st_size >= size:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    blocks = [filler_block(seed, 4 << 20) for seed in range(4)]
    written = 0
    with path.open("wb") as fh:
        fh.write(STARTUP)
        written += len(STARTUP)
        i = 0
        while written < size:
            if written > size // 2 and i >= 0:
                fh.write(STARTUP)  # a restart half-way
                written += len(STARTUP)
                i = -(1 << 30)
            b = blocks[abs(i) % 4]
            fh.write(b)
            written += len(b)
            i += 1
    return path


if __name__ == "__main__":
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 30
    print(generate(Path(sys.argv[1]), size))
