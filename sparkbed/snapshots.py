"""
Model snapshots written as ``huggingface_hub`` lays out its cache (content-addressed blobs,
``snapshots/<revision>`` symlinks, ``refs/main``), of random files of given sizes, for staging
tests and benchmarks.
"""

from __future__ import annotations

import os
from pathlib import Path


def make_snapshot(cache_dir: Path, repo: str, revision: str, large: int, large_bytes: int, small: int,
                  small_bytes: int = 4096, seed: int = 0) -> Path:
    """
    Write a snapshot as ``huggingface_hub`` lays out its cache: content-addressed blobs,
    ``snapshots/<revision>/<file>`` symlinks to them, ``refs/main``. Random content.
    """
    import hashlib
    import random

    repo_dir = cache_dir / f"models--{repo.replace('/', '--')}"
    blobs, snap = repo_dir / "blobs", repo_dir / "snapshots" / revision
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    rng = random.Random(seed)
    files = [(f"model-{i + 1:05d}-of-{large:05d}.safetensors", large_bytes) for i in range(large)]
    files += [(f"extra/part-{i:04d}.json", small_bytes) for i in range(small)]
    files += [("config.json", 0)]
    for name, size in files:
        tmp = blobs / ".incoming"
        digest = hashlib.sha256()
        with open(tmp, "wb") as out:
            if name == "config.json":
                chunk = b'{"architectures": ["SyntheticMoE"], "model_type": "llama"}'
                out.write(chunk)
                digest.update(chunk)
            left = size
            while left > 0:
                chunk = rng.randbytes(min(left, 16 << 20))
                out.write(chunk)
                digest.update(chunk)
                left -= len(chunk)
        blob = blobs / digest.hexdigest()
        tmp.rename(blob)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    return repo_dir
