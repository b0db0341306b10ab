"""One text file that is equal for two runs exactly when their trained tensors, logged scalars (wall-clock keys left
out) and evaluation outputs are byte-identical: ``python digest.py OUT`` writes OUT/digest.txt."""
import glob
import hashlib
import json
import os
import sys

import torch

WALL_CLOCK = ("time", "data_time", "eta", "memory")


def tensor_digest(state: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(state):
        value = state[key]
        if torch.is_tensor(value):
            h.update(key.encode())
            h.update(value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main(out: str) -> None:
    checkpoint = torch.load(f"{out}/grpo/iter_3.pth", map_location="cpu", weights_only=False)
    state = checkpoint.get("state_dict", checkpoint)
    lines = [f"grpo iter_3 state_dict tensors: {len(state)} sha256 {tensor_digest(state)}"]
    for path in sorted(glob.glob(f"{out}/grpo/*/vis_data/scalars.json")):
        for row in open(path):
            scalars = {k: v for k, v in json.loads(row).items()
                       if k not in WALL_CLOCK and not k.startswith("time/") and not k.endswith("time_s")}
            lines.append("scalars " + json.dumps(scalars, sort_keys=True))
    for path in sorted(glob.glob(f"{out}/eval_*/metrics.json")) + sorted(glob.glob(f"{out}/eval_*/records/*.jsonl")):
        data = open(path, "rb").read().replace(out.encode(), b"OUT")
        lines.append(f"{os.path.relpath(path, out)} sha256 {hashlib.sha256(data).hexdigest()}")
    open(f"{out}/digest.txt", "w").write("\n".join(lines) + "\n")
    print("\n".join(line[:160] for line in lines))


if __name__ == "__main__":
    main(sys.argv[1])
