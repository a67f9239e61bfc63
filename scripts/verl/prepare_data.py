"""Write verl parquet files (train + validation) for a rapo env, played by rapo's verl agent loop.

    python scripts/verl/prepare_data.py --out data/verl --env-id RAPO-Math-v0 --num-tasks 5000
    python scripts/verl/prepare_data.py --out data/verl --dataset /path/to/train_10k.parquet --no-validation
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rapo_agents.integrations.verl.data import verl_rows, write_parquet  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data/verl", help="folder for train.parquet and validation.parquet")
    parser.add_argument("--env-id", default="RAPO-Math-v0", help="registered rapo env id")
    parser.add_argument("--dataset", default="procedural", help="the env's dataset argument")
    parser.add_argument("--num-tasks", type=int, default=5000, help="procedural tasks per split")
    parser.add_argument("--env-kwargs", default="{}", help="extra env keyword arguments as JSON")
    parser.add_argument("--no-validation", action="store_true", help="write train.parquet only")
    args = parser.parse_args(argv)
    base = {"dataset": args.dataset, **json.loads(args.env_kwargs)}
    if args.dataset == "procedural":
        base["num_tasks"] = args.num_tasks
    splits = ["train"] if args.no_validation else ["train", "validation"]
    for split in splits:
        env_kwargs = {**base, "split": split} if args.dataset == "procedural" else base
        path = write_parquet(verl_rows(args.env_id, env_kwargs), Path(args.out) / f"{split}.parquet")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
