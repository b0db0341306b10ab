"""Score predicted captions on DLC-Bench (or any qa.json in its layout) with an LLM judge.

Same protocol as DLC-Bench's ``eval_model_outputs.py`` in the default ``per_question`` mode
(exact prompt, recognition gate, answer parsing, Pos / Neg / Avg), with concurrency, retries and
a persistent cache, so a re-run after a failure only asks what is missing::

    sa2va-rl judge dlc-bench --pred preds.json --qa DLC-bench/qa.json \\
        --class-names DLC-bench/class_names.json --base-url http://127.0.0.1:9100/v1 \\
        --cache work_dirs/judge_cache.sqlite --out preds_eval.json

``preds.json`` is ``{ann_id: caption}``. The API key is read from ``$OPENAI_API_KEY`` (or the
variable named by ``--api-key-env``). Exit status 1 when some keys could not be judged (they are
listed), unless ``--allow-failures``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from projects.llava_sam2.rl_train.rewards.judge import (
    JUDGE_MODES,
    DLCJudge,
    JudgeClient,
    evaluate_predictions,
    load_predictions,
    load_qa,
)

PROG = "sa2va-rl judge dlc-bench"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--pred", required=True, type=Path, help="JSON {ann_id: caption}")
    parser.add_argument("--qa", default="DLC-bench/qa.json", type=Path)
    parser.add_argument("--class-names", default="DLC-bench/class_names.json", type=Path)
    parser.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (else $JUDGE_BASE_URL)")
    parser.add_argument("--model", default=None, help="judge model (else $JUDGE_MODEL, else Llama-3.1-8B-Instruct)")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the key")
    parser.add_argument("--mode", default="per_question", choices=JUDGE_MODES)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--max-retries", type=int, default=3)
    parser.add_argument("--cache", default=None, help="SQLite cache file (re-runs reuse answers)")
    parser.add_argument("--default-prediction", default=None, help="caption for missing / 'Error:' predictions")
    parser.add_argument("--out", type=Path, default=None, help="write per-key scores and the summary here")
    parser.add_argument("--csv", action="store_true", help="print only 'pos,neg,avg'")
    parser.add_argument("--allow-failures", action="store_true", help="exit 0 even if some keys failed")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    qa = load_qa(args.qa, args.class_names)
    predictions = load_predictions(args.pred)
    client = JudgeClient(dict(
        base_url=args.base_url, model=args.model, api_key_env=args.api_key_env,
        max_concurrency=args.concurrency, timeout_s=args.timeout_s, max_retries=args.max_retries,
        cache_path=args.cache,
    ))
    if not client.endpoint_configured:
        print(f"{PROG}: no judge endpoint; pass --base-url or set $JUDGE_BASE_URL", file=sys.stderr)
        return 2
    judge = DLCJudge(client, args.mode)

    async def run():
        try:
            return await evaluate_predictions(predictions, qa, judge, args.default_prediction)
        finally:
            await client.aclose()

    report = asyncio.run(run())
    client.cache.close()
    if args.out:
        payload = report.to_json()
        payload["settings"] = {"mode": args.mode, **client.describe()}
        args.out.write_text(json.dumps(payload, indent=1))
    summary = report.summary
    if args.csv and summary:
        print(f"{summary['pos']:.3f},{summary['neg']:.3f},{summary['avg']:.3f}")
    elif summary:
        print(f"Result for {args.pred} ({len(report.scores)}/{len(qa)} keys, judge {client.model}, {args.mode})")
        print(f"Summary (Pos\tNeg\tAvg(Pos, Neg)):\t{summary['pos']:.3f},\t{summary['neg']:.3f},\t{summary['avg']:.3f}")
    if report.defaulted_keys:
        print(f"{len(report.defaulted_keys)} keys used the default prediction", file=sys.stderr)
    if report.failures:
        print(f"{len(report.failures)} keys could not be judged: {report.failures}", file=sys.stderr)
        return 0 if args.allow_failures else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
