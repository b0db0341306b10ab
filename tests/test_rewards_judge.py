"""The LLM judge against a real local OpenAI-compatible HTTP server (benchmarks/openai_stub_server.py):
scripted answers, injected latency / HTTP 500 / 429 / timeouts / garbage; fallbacks, failure
counts, cache hits, secrets, and the two tools."""
import asyncio
import importlib
import json
import logging
from pathlib import Path

import openai
import pytest
from rewards_dlc_fixture import CLASS_NAMES, EXPECTED, EXPECTED_BATCHED, PREDICTIONS, QA, scripted_answer

from projects.llava_sam2.rl_train.benchmarks.openai_stub_server import (GENERATED_QA, Fault, StubServer,
                                                                         default_responder)
from projects.llava_sam2.rl_train.cli import judge_dlc_bench as eval_dlc_bench
from projects.llava_sam2.rl_train.cli import judge_questions as precompute_judge_questions
from projects.llava_sam2.rl_train.rewards import DLCJudgeReward, RewardComposer, RewardInputs
from projects.llava_sam2.rl_train.rewards.judge import DLCJudge, JudgeClient, evaluate_predictions, load_qa
from projects.llava_sam2.rl_train.rewards.judge import prompts as judge_prompts

SECRET = "sk-test-never-log-this-1234"
# the HTTP library openai's clients are built on (httpx, or httpx2 in recent openai releases)
HTTP = importlib.import_module(openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])


@pytest.fixture
def qa_files(tmp_path):
    qa_path, names_path = tmp_path / "qa.json", tmp_path / "class_names.json"
    qa_path.write_text(json.dumps(QA))
    names_path.write_text(json.dumps(CLASS_NAMES))
    return qa_path, names_path


class ConstReward:
    """A stand-in for METEOR: a fixed value per rollout (sync)."""

    def __init__(self, value: float, name: str = "lexical", weight: float = 0.25):
        self.name, self.weight, self.value = name, weight, value

    def __call__(self, inputs):
        return [self.value] * len(inputs)


@pytest.mark.parametrize("mode, requests_per_key", [("per_question", {"101": 5, "102": 3, "103": 3}),
                                                    ("batched", {"101": 1, "102": 1, "103": 1})])
def test_judge_reproduces_fixture_scores_and_caches(qa_files, tmp_path, mode, requests_per_key):
    qa = load_qa(*qa_files)
    with StubServer(lambda prompt, attempt: scripted_answer(prompt)) as server:
        client = JudgeClient(dict(base_url=server.base_url, cache_path=str(tmp_path / "cache.sqlite")))

        async def run_twice():
            first = await evaluate_predictions(PREDICTIONS, qa, DLCJudge(client, mode))
            second = await evaluate_predictions(PREDICTIONS, qa, DLCJudge(client, mode))
            await client.aclose()
            return first, second

        first, second = asyncio.run(run_twice())
        assert len(server.requests) == sum(requests_per_key.values())  # the repeat was all cache hits
        assert client.counters["cache_hits"] == sum(requests_per_key.values())
    expected = EXPECTED if mode == "per_question" else EXPECTED_BATCHED
    for report in (first, second):
        assert not report.failures
        for key, (score, pos, neg, recognised, unparsed) in expected.items():
            got = report.scores[key]
            assert (got.score, got.score_pos, got.score_neg, got.recognition, got.n_unparsed) == (
                score, pos, neg, recognised, unparsed), key
        # Pos = (0.5 + 0 - 0.25) / 3; Neg = (0.5 + 0) / 2 per question, (0 + 0) / 2 batched (101's "C" unparsed)
        neg = 0.25 if mode == "per_question" else 0.0
        assert report.summary["avg"] == pytest.approx((0.25 / 3 + neg) / 2)
    if mode == "per_question":  # DLC-Bench's exact prompt went over the wire
        assert all(judge_prompts.is_dlc_eval_prompt(p) for p in server.requests)


def _fault_responder(prompt: str, attempt: int):
    """Scripted by the predicted caption's first word."""
    caption = prompt.split("The description is:\n", 1)[1].split("\n", 1)[0]
    kind = caption.split()[0]
    if kind == "http500":
        return Fault("http_500")
    if kind == "http429":
        return Fault("http_429")
    if kind == "flaky429" and attempt == 0:
        return Fault("http_429")
    if kind == "garbage":
        return "I think the description is lovely."
    if kind == "empty":
        return Fault("empty")
    if kind == "badjson":
        return Fault("bad_json")
    return default_responder(prompt, attempt)


class TimeoutInjectingTransport(HTTP.AsyncHTTPTransport):
    """The judge client's HTTP transport: a request whose caption starts with "hang" times out at once (the
    exception a transport raises when the server does not answer in time); every other request goes to the server.
    No wall clock decides which request times out."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []  # the caption of every attempt, injected timeouts included

    async def handle_async_request(self, request):
        prompt = json.loads(request.content)["messages"][0]["content"]
        caption = prompt.split("The description is:\n", 1)[1].split("\n", 1)[0]
        self.sent.append(caption)
        if caption.startswith("hang"):
            raise HTTP.ReadTimeout("injected: the server did not answer in time", request=request)
        return await super().handle_async_request(request)


def test_faults_fall_back_with_counts_and_never_raise(qa_files, tmp_path, caplog, monkeypatch):
    kinds = ["ok", "http500", "http429", "flaky429", "hang", "garbage", "empty", "badjson", "ok"]
    preds = [f"{kind} caption {i}" for i, kind in enumerate(kinds)]
    inputs = RewardInputs(sample_ids=["101"] * len(kinds), pred_captions=preds, gt_captions=["a dog"] * len(kinds))
    transport = TimeoutInjectingTransport()
    # the judge's HTTP client (openai's aiohttp one by default) through the timeout-injecting transport
    monkeypatch.setattr(openai, "DefaultAioHttpClient", lambda: openai.DefaultAsyncHttpxClient(transport=transport))
    # a timeout far above any reply time: only the injected one can time out, however loaded the machine is
    with StubServer(_fault_responder, latency_s=0.02) as server:
        judge = DLCJudgeReward(
            judge=dict(base_url=server.base_url, timeout_s=600.0, max_retries=1, cache_path=str(tmp_path / "c.sqlite")),
            mode="batched", qa_path=str(qa_files[0]), class_names_path=str(qa_files[1]))
        composer = RewardComposer([ConstReward(0.4), judge])
        with caplog.at_level(logging.INFO):
            total, stats = composer.compute(inputs)
        n_first = len(transport.sent)
        total_again, stats_again = composer.compute(inputs)
        second = transport.sent[n_first:]
        composer.close()
    # default responder answers "A" to all 5 questions of key 101: recognised, pos 0 and -1, neg 1 and 1
    # -> score (0 - 1 + 1 + 1) / 4 = 0.25 -> unit reward (0.25 + 1) / 2 = 0.625
    ok = 0.25 * 0.4 + 0.75 * 0.625
    expected = [ok, 0.4, 0.4, ok, 0.4, 0.4, 0.4, 0.4, ok]  # failures fall back to the other reward alone
    assert total.tolist() == pytest.approx(expected, abs=1e-6)
    assert total_again.tolist() == pytest.approx(expected, abs=1e-6)
    failures = {k.split("/failures/")[1]: v for k, v in stats.items() if "/failures/" in k}
    assert failures == {"http_500": 1, "http_429": 1, "timeout": 1, "unparsable": 1, "empty_answer": 1,
                        "bad_response": 1}
    assert stats["dlc_judge/missing"] == 6 and stats["total/fallback"] == 6 and stats["total/invalid"] == 0
    assert stats["dlc_judge/mean"] == pytest.approx(0.625)
    assert transport.sent.count("hang caption 4") == 4  # two attempts (max_retries=1) in each compute
    # the successes (two "ok" and the retried 429) are cached; the failures are asked again
    assert stats_again["dlc_judge/cache_hits"] == 3
    assert {caption.split()[0] for caption in second} == {"http500", "http429", "hang", "garbage", "empty", "badjson"}
    assert SECRET not in caplog.text


def test_question_generation_cached_per_caption_and_failures_counted(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)

    def responder(prompt, attempt):
        if judge_prompts.is_question_generation_prompt(prompt) and "unusable reference" in prompt:
            return '{"class_name": "thing", "positive": "not a list"}'
        return default_responder(prompt, attempt)

    gts = ["a red object on a table"] * 3 + ["an unusable reference"]
    inputs = RewardInputs(sample_ids=[f"s#{i}" for i in range(4)], pred_captions=["a red thing"] * 3 + ["x"],
                          gt_captions=gts)
    cache = str(tmp_path / "judge.sqlite")
    with StubServer(responder) as server:
        reward = DLCJudgeReward(judge=dict(base_url=server.base_url, cache_path=cache, max_retries=0))
        composer = RewardComposer([ConstReward(0.2), reward])
        _, stats = composer.compute(inputs)
        generation = [p for p in server.requests if judge_prompts.is_question_generation_prompt(p)]
        assert len(generation) == 2  # one per unique caption, the three identical ones shared
        assert stats["dlc_judge/failures/questions/unparsable"] == 1
        # GENERATED_QA answered "A" everywhere: recognised, pos 1, neg 1 -> score 1 -> unit 1.0
        assert stats["dlc_judge/mean"] == pytest.approx(1.0)
        # a new reward (new process) on the same cache file asks nothing for the good caption
        before = len(server.requests)
        fresh = RewardComposer([ConstReward(0.2), DLCJudgeReward(judge=dict(base_url=server.base_url, cache_path=cache))])
        _, stats2 = fresh.compute(inputs)
        composer.close()
        fresh.close()
        new = server.requests[before:]
        assert [judge_prompts.is_question_generation_prompt(p) for p in new] == [True]  # only the bad one again
        assert stats2["dlc_judge/cache_hits"] >= 4
        assert server.auth_headers == {f"Bearer {SECRET}"}  # the key is sent ...
    text = Path(cache).read_bytes()
    assert SECRET.encode() not in text  # ... but never cached, shown or described
    assert SECRET not in repr(reward) and SECRET not in json.dumps(reward.client.describe())
    assert json.loads(json.dumps(GENERATED_QA))["class_name"] == "object"


def test_no_endpoint_warns_once_and_falls_back(monkeypatch, caplog):
    monkeypatch.delenv("JUDGE_BASE_URL", raising=False)
    with caplog.at_level(logging.WARNING):
        reward = DLCJudgeReward()
        composer = RewardComposer([ConstReward(0.3, weight=0.25), reward])
        inputs = RewardInputs(sample_ids=["a", "b"], pred_captions=["x", "y"], gt_captions=["x", "y"])
        total, stats = composer.compute(inputs)
        composer.compute(inputs)
    assert total.tolist() == pytest.approx([0.3, 0.3])
    assert stats["dlc_judge/failures/no_endpoint"] == 2
    assert sum("no judge endpoint" in r.getMessage() for r in caplog.records) == 1


def test_deadline_and_bad_config(qa_files):
    with StubServer(lambda p, a: Fault("hang", hang_s=3.0)) as server:
        reward = DLCJudgeReward(judge=dict(base_url=server.base_url, timeout_s=10, max_retries=0), deadline_s=0.3,
                                qa_path=str(qa_files[0]), class_names_path=str(qa_files[1]))
        inputs = RewardInputs(sample_ids=["103"], pred_captions=["x"], gt_captions=["y"])
        composer = RewardComposer([reward])
        result = composer.compute(inputs)
        composer.close()
    assert result[1]["dlc_judge/failures/deadline"] == 1 and result[1]["total/invalid"] == 1
    with pytest.raises(ValueError, match="mode must be one of"):
        DLCJudgeReward(mode="fast")
    with pytest.raises(ValueError, match="unknown judge config keys"):
        DLCJudgeReward(judge=dict(url="http://x"))
    with pytest.raises(ValueError, match="together"):
        DLCJudgeReward(qa_path="qa.json")


def test_unreachable_server_counts_connection():
    import socket

    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reward = DLCJudgeReward(judge=dict(base_url=f"http://127.0.0.1:{port}/v1", max_retries=0, timeout_s=5))
    composer = RewardComposer([ConstReward(0.5), reward])
    total, stats = composer.compute(RewardInputs(sample_ids=["a"], pred_captions=["x"], gt_captions=["y"]))
    composer.close()
    assert total.tolist() == [0.5] and stats["dlc_judge/failures/questions/connection"] == 1


def test_eval_and_precompute_tools(qa_files, tmp_path, capsys):
    pred_path = tmp_path / "preds.json"
    pred_path.write_text(json.dumps({**PREDICTIONS, "query": "ignored"}))
    out = tmp_path / "eval.json"
    with StubServer(lambda prompt, attempt: scripted_answer(prompt)) as server:
        argv = ["--pred", str(pred_path), "--qa", str(qa_files[0]), "--class-names", str(qa_files[1]),
                "--base-url", server.base_url, "--cache", str(tmp_path / "e.sqlite"), "--out", str(out), "--csv"]
        assert eval_dlc_bench.main(argv) == 0
        assert capsys.readouterr().out.strip() == "0.083,0.250,0.167"
        n = len(server.requests)
        assert eval_dlc_bench.main(argv) == 0 and len(server.requests) == n  # re-run: all cached
    report = json.loads(out.read_text())
    assert report["summary"]["pos"] == pytest.approx(0.25 / 3) and report["failures"] == {}
    pred_path.write_text(json.dumps({"101": PREDICTIONS["101"]}))  # missing keys, no default: clear error
    with pytest.raises(ValueError, match="key '102' is missing"):
        eval_dlc_bench.main(["--pred", str(pred_path), "--qa", str(qa_files[0]), "--class-names", str(qa_files[1]),
                             "--base-url", "http://127.0.0.1:9/v1"])

    captions = tmp_path / "captions.jsonl"
    captions.write_text('{"id": "a#1", "caption": "a red car"}\n{"id": "a#2", "caption": "a red car"}\n'
                        '{"id": "b#1", "caption": "a blue boat"}\n')
    with StubServer() as server:
        argv = ["--captions", str(captions), "--base-url", server.base_url, "--cache", str(tmp_path / "q.sqlite"),
                "--out-qa", str(tmp_path / "gen_qa.json"), "--out-class-names", str(tmp_path / "gen_names.json")]
        assert precompute_judge_questions.main(argv) == 0
        assert precompute_judge_questions.main(argv) == 0
        assert len(server.requests) == 2  # two unique captions, once; the second run hit the cache
    generated = load_qa(tmp_path / "gen_qa.json", tmp_path / "gen_names.json")
    assert sorted(generated) == ["a#1", "a#2", "b#1"] and generated["a#1"].class_name == "object"


def test_credentials_in_the_base_url_never_reach_the_log(monkeypatch, caplog):
    """A base URL with a user and password (from the config or $JUDGE_BASE_URL) was logged as is
    by the reward's start-up line (the client's repr) and written by describe()."""
    url = f"https://judge-user:{SECRET}@judge.example.org:8443/v1"
    monkeypatch.setenv("JUDGE_BASE_URL", url)
    with caplog.at_level(logging.INFO):
        from_env = DLCJudgeReward()
        from_config = DLCJudgeReward(judge=dict(base_url=url))
    for reward in (from_env, from_config):
        assert reward.client.base_url == url  # still used to connect
        shown = repr(reward) + json.dumps(reward.client.describe())
        assert SECRET not in shown and "judge-user" not in shown
        assert "https://***@judge.example.org:8443/v1" in shown
    assert "judge.example.org" in caplog.text and SECRET not in caplog.text and "judge-user" not in caplog.text
