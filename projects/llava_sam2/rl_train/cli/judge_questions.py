"""Generate DLC-Bench-style judge questions for every caption of a dataset, ahead of training.

Each unique caption is sent once to the question-generation prompt; valid replies land in the
judge cache that the ``dlc_judge`` reward reads (same model, same prompt -> same cache key), so
training asks only answer questions. The questions are also written in DLC-Bench's layout::

    sa2va-rl judge questions --captions captions.json \\
        --base-url http://127.0.0.1:8000/v1 --cache work_dirs/judge_cache.sqlite \\
        --out-qa work_dirs/qa.json --out-class-names work_dirs/class_names.json

``captions.json`` is ``{sample_id: caption}`` or JSON lines ``{"id": ..., "caption": ...}``.
Captions whose questions could not be generated are listed with their cause (exit status 1).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

from projects.llava_sam2.rl_train.rewards.judge import JudgeClient, JudgeError, QuestionGenerator, save_qa

PROG = "sa2va-rl judge questions"


def load_captions(path: Path) -> dict[str, str]:
    """``{id: caption}`` from a JSON object or JSON lines with ``id`` and ``caption``."""
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        items = data.items()
    else:
        items = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or "id" not in row or "caption" not in row:
                raise ValueError(f"{path} line {number}: expected {{\"id\": ..., \"caption\": ...}}, got {line[:80]!r}")
            items.append((row["id"], row["caption"]))
    captions = {str(k): v for k, v in items}
    bad = [k for k, v in captions.items() if not isinstance(v, str) or not v.strip()]
    if bad:
        raise ValueError(f"{path}: {len(bad)} ids have no caption text, e.g. {bad[:3]}")
    return captions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--captions", required=True, type=Path)
    parser.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (else $JUDGE_BASE_URL)")
    parser.add_argument("--model", default=None, help="question-writer model (use the reward's judge model)")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY")
    parser.add_argument("--cache", required=True, help="SQLite judge cache the reward will read")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--max-retries", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=1024, help="must equal the reward's question_max_tokens")
    parser.add_argument("--out-qa", type=Path, default=None)
    parser.add_argument("--out-class-names", type=Path, default=None)
    args = parser.parse_args(argv)
    if (args.out_qa is None) != (args.out_class_names is None):
        parser.error("give --out-qa and --out-class-names together")

    captions = load_captions(args.captions)
    client = JudgeClient(dict(base_url=args.base_url, model=args.model, api_key_env=args.api_key_env,
                              max_concurrency=args.concurrency, timeout_s=args.timeout_s,
                              max_retries=args.max_retries, cache_path=args.cache))
    generator = QuestionGenerator(client, max_tokens=args.max_tokens)
    unique = sorted(set(captions.values()))

    async def run():
        try:
            return await generator.generate_many(unique)
        finally:
            await client.aclose()

    outcomes = dict(zip(unique, asyncio.run(run())))
    entries, failures = {}, {}
    for sample_id, caption in captions.items():
        outcome = outcomes[caption]
        if isinstance(outcome, JudgeError):
            failures[sample_id] = outcome.cause
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            entries[sample_id] = outcome
    if args.out_qa:
        save_qa(entries, args.out_qa, args.out_class_names)
    print(f"questions for {len(entries)}/{len(captions)} samples ({len(unique)} unique captions); "
          f"requests {client.counters['requests']}, cache hits {client.counters['cache_hits']}")
    client.cache.close()
    if failures:
        print(f"failed: {dict(Counter(failures.values()))}; ids: {sorted(failures)[:20]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
