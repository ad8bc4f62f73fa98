"""`specexport bench` end to end on a tiny bundle: records, the Spec-Bench-style table, the plot."""
import json
import re
from pathlib import Path

import pytest

from specexport.cli import main


def test_bench_writes_records_table_and_plot(bundle_noisy, tmp_path):
    qs = tmp_path / "question.jsonl"
    turns = [("writing", "hello world, hello world"), ("writing", "abc abc abc"), ("math", "Q: 12+7? A:")]
    qs.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [t]})
                            for i, (c, t) in enumerate(turns)))
    out = tmp_path / "out"
    methods = ["se-none", "se-ngram-k2", "se-recycle-k2", "se-none@same"]  # @same: the same bundle loaded again
    assert main(["bench", str(bundle_noisy), "--questions", str(qs), "--per-category", "1", "--max-new-tokens", "12",
                 "--methods", ",".join(methods), "--extra-bundle", f"same={bundle_noisy}", "--out", str(out)]) == 0
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert [(r["question_id"], r["method"]) for r in records] == [(q, m) for q in (0, 2) for m in methods]
    assert all(r["identical"] and r["new_tokens"] > 0 and r["bandwidth_gbs"] > 0 for r in records)
    table = (out / "summary.md").read_text()
    assert "| method | writing | math | overall |" in table
    for m in methods:
        assert f"| {m} |" in table
    assert "Memory floor" in table and "Plain decode step (se-none, inside ORT)" in table
    assert (out / "speedup.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_sampled(bundle_noisy, tmp_path):
    """--temperature: every specexport method draws the same tokens (Gumbel noise per position), checked
    against the first one; the text differs from greedy decoding."""
    qs = tmp_path / "question.jsonl"
    turns = [("writing", "hello world, hello world"), ("math", "Q: 12+7? A:")]
    qs.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [t]})
                            for i, (c, t) in enumerate(turns)))
    methods = ["se-none", "se-ngram-k2", "se-recycle-k2", "se-model-k2"]
    runs = {}
    for name, extra in [("greedy", []), ("sampled", ["--temperature", "1.0", "--seed", "3"])]:
        out = tmp_path / name
        assert main(["bench", str(bundle_noisy), "--questions", str(qs), "--per-category", "1",
                     "--max-new-tokens", "12", "--methods", ",".join(methods), "--out", str(out), *extra]) == 0
        runs[name] = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    sampled = runs["sampled"]
    assert [r["identical"] for r in sampled if r["method"] == "se-none"] == [None, None]  # the reference itself
    assert all(r["identical"] and r["reference"] == "se-none" for r in sampled if r["method"] != "se-none")
    table = (tmp_path / "sampled" / "summary.md").read_text()
    assert "sampled (temperature 1.0, top-p 1.0, seed 3" in table and "| n/a |" in table
    outputs = {name: [r["output_sha1"] for r in rs if r["method"] == "se-none"] for name, rs in runs.items()}
    assert outputs["greedy"] != outputs["sampled"]  # the options reached the generation


def test_bench_refuses_unknown_bundle_tag(bundle_noisy, tmp_path, capsys):
    qs = tmp_path / "question.jsonl"
    qs.write_text(json.dumps({"question_id": 0, "category": "writing", "turns": ["hi"]}))
    assert main(["bench", str(bundle_noisy), "--questions", str(qs), "--methods", "se-none,se-none@x",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--extra-bundle x=PATH" in capsys.readouterr().err


@pytest.mark.parametrize("opt,value,name", [("--temperature", "-1", "temperature"), ("--temperature", "nan", "temperature"),
                                            ("--top-p", "0", "top_p"), ("--seed", "-3", "seed")])
def test_bench_refuses_bad_sampling_options(bundle_noisy, tmp_path, capsys, opt, value, name):
    assert main(["bench", str(bundle_noisy), "--methods", "se-none", opt, value, "--out", str(tmp_path / "o")]) == 2
    assert f"error: {name} must be" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before any work


def write_questions(path, turns):
    path.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [t]})
                              for i, (c, t) in enumerate(turns)))
    return path


def test_bench_skips_missing_peers_with_one_line(bundle_noisy, tmp_path, capsys):
    """A peer that is not installed or has no converted model is skipped with one line saying how to get it;
    the rest runs. --limit takes questions round-robin over the categories."""
    qs = write_questions(tmp_path / "q.jsonl", [("writing", "abc abc"), ("writing", "xyz"), ("math", "1+1=")])
    out = tmp_path / "out"
    methods = "se-none,ov,ov-int4-pld,ortgenai,se-ngram-k2"
    assert main(["bench", str(bundle_noisy), "--questions", str(qs), "--limit", "2", "--max-new-tokens", "6",
                 "--methods", methods, "--ov-model", str(tmp_path / "no-ir"), "--ov-int4-model",
                 str(tmp_path / "no-ir4"), "--ortgenai-model", str(tmp_path / "no-og"), "--out", str(out)]) == 0
    err = capsys.readouterr().out
    skipped = [x for x in err.splitlines() if x.startswith("skipping ")]
    assert len(skipped) == 3 and all(("pip install" in x or "bash scripts/bench.sh" in x) for x in skipped), skipped
    assert "Traceback" not in err
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    want = [(q, m) for q in (0, 2) for m in ("se-none", "se-ngram-k2")]
    assert [(r["question_id"], r["method"]) for r in records] == want
    assert all(r["cpu"] and "cpu_flags" in r for r in records)
    table = (out / "summary.md").read_text()
    assert table.startswith("Machine: ")
    assert "Skipped (not installed or no model here): ov, ov-int4-pld, ortgenai" in table
    assert json.loads((out / "config.json").read_text())["run"]["machine"]["model"]


def test_bench_repeats_and_noise_warning(bundle_noisy, tmp_path):
    """--repeats keeps the median and the runs; a spread over --noise is called out in the summary. Repeats of
    a recycle method start from the same successor table, so they produce the same tokens."""
    qs = write_questions(tmp_path / "q.jsonl", [("writing", "hello world, hello world")])
    out = tmp_path / "out"
    assert main(["bench", str(bundle_noisy), "--questions", str(qs), "--max-new-tokens", "8", "--repeats", "3",
                 "--noise", "0", "--methods", "se-none,se-recycle-k2", "--out", str(out)]) == 0
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert all(len(r["seconds_runs"]) == 3 and r["seconds"] in r["seconds_runs"] for r in records)
    assert all(r["identical"] and "repeats_identical" not in r for r in records)
    table = (out / "summary.md").read_text()
    assert "median of 3 runs each" in table and "**Noisy samples**" in table


def test_bench_finds_questions_without_the_cwd(tmp_path, monkeypatch):
    from specexport.bench import find_questions

    monkeypatch.delenv("SPECBENCH", raising=False)
    monkeypatch.chdir(tmp_path)
    repo = Path(__file__).resolve().parents[1]
    expect = [p for p in (repo.parent / "shared/specbench/question.jsonl", repo / "shared/specbench/question.jsonl")
              if p.is_file()]
    if expect:
        assert find_questions() == expect[0]
    else:
        with pytest.raises(FileNotFoundError, match="--questions PATH"):
            find_questions()
    monkeypatch.setenv("SPECBENCH", str(write_questions(tmp_path / "mine.jsonl", [("qa", "hi")])))
    assert find_questions() == tmp_path / "mine.jsonl"
    with pytest.raises(FileNotFoundError, match="no Spec-Bench questions at"):
        find_questions(str(tmp_path / "absent.jsonl"))


def test_bench_concurrency_mode(bundle_noisy, tmp_path):
    """--concurrency: requests through the batching engine at each level; aggregate throughput, TTFT/TPOT
    percentiles, every output == its solo run, records + table + both plots."""
    qs = write_questions(tmp_path / "q.jsonl", [("writing", "hello world, hello world"), ("math", "Q: 12+7? A:")])
    out = tmp_path / "out"
    methods = ["se-none", "se-ngram-k2", "se-recycle-kauto", "se-model-k2"]
    assert main(["bench", str(bundle_noisy), "--questions", str(qs), "--per-category", "1", "--max-new-tokens",
                 "10", "--concurrency", "1,2", "--methods", ",".join(methods), "--out", str(out)]) == 0
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert {(r["concurrency"], r["method"]) for r in records} == {(c, m) for c in (1, 2) for m in methods}
    assert len(records) == 2 * 4 * 2 and all(r["identical"] and r["new_tokens"] > 0 for r in records)
    assert all(0 < r["ttft_s"] <= r["latency_s"] and r["cpu"] for r in records)
    aggs = [json.loads(x) for x in (out / "aggregates.jsonl").read_text().splitlines()]
    assert all(a["tokens_per_s"] > 0 and a["pool_bytes"] > 0 for a in aggs)
    assert max(int(b) for a in aggs if a["concurrency"] == 2 for b in a["batch"]) == 2  # requests shared calls
    # the engine's calls: only the draft model's requests made draft calls, and the summary shows both counts
    drafted = {a["method"]: sum(a["draft_batch"].values()) for a in aggs if a["concurrency"] == 2}
    assert drafted["se-model-k2"] > 0 and drafted["se-none"] == drafted["se-ngram-k2"] == 0, drafted
    table = (out / "summary.md").read_text()
    assert "| concurrency | method | tokens/s | vs solo plain | TTFT p50 s |" in table
    steps = next(a["steps"] for a in aggs if a["concurrency"] == 2 and a["method"] == "se-model-k2")
    assert re.search(rf"\| 2 \| se-model-k2 \|.*\| {steps} \| {drafted['se-model-k2']} \|", table), table
    # the solo reference is measured before and after the levels, and the summary says both
    before, after = re.search(r"plain decoding = [\d.]+ tokens/s \(([\d.]+) before the levels, ([\d.]+) after\)",
                              table).groups()
    assert float(before) > 0 and float(after) > 0
    for c in (1, 2):
        for m in methods:
            assert f"| {c} | {m} |" in table
    for png in ("throughput.png", "latency.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_bench_concurrency_poisson_and_refusals(bundle_noisy, tmp_path, capsys):
    qs = write_questions(tmp_path / "q.jsonl", [("writing", "abc abc abc"), ("math", "1 2 3 1 2 3")])
    out = tmp_path / "out"
    assert main(["bench", str(bundle_noisy), "--questions", str(qs), "--max-new-tokens", "6", "--concurrency", "2",
                 "--arrival", "poisson", "--rate", "20", "--requests", "3", "--methods", "se-none,se-ngram-k2@b,se-model-k2",
                 "--extra-bundle", f"b={bundle_noisy}", "--out", str(out)]) == 0
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 9 and all(r["identical"] for r in records)
    assert records[0]["submit_s"] < records[2]["submit_s"]  # arrivals spread in time
    assert [r["question_id"] for r in records[:3]] == [0, 1, 0]  # 3 requests over the 2 questions, in turn
    # fewer requests than questions: the levels and the solo reference run the same first ones
    # ... and with --repeats the methods' order rotates each repeat (neither always runs first)
    assert main(["bench", str(bundle_noisy), "--questions", str(qs), "--max-new-tokens", "4", "--concurrency", "1",
                 "--requests", "1", "--repeats", "3", "--methods", "se-none,se-ngram-k2",
                 "--out", str(tmp_path / "one")]) == 0
    run = json.loads((tmp_path / "one" / "config.json").read_text())["run"]
    records = [json.loads(x) for x in (tmp_path / "one" / "records.jsonl").read_text().splitlines()]
    assert run["solo_prompts"] == 1 and {r["question_id"] for r in records} == {0}
    assert [(r["repeat"], r["method"]) for r in records] == [(0, "se-none"), (0, "se-ngram-k2"), (1, "se-ngram-k2"),
                                                             (1, "se-none"), (2, "se-none"), (2, "se-ngram-k2")]
    for argv, msg in [(["--arrival", "poisson"], "--rate"), (["--methods", "hf"], "does not run under --concurrency")]:
        assert main(["bench", str(bundle_noisy), "--questions", str(qs), "--concurrency", "1", "--out",
                     str(tmp_path / "o"), *argv]) == 2
        assert msg in capsys.readouterr().err
    assert main(["bench", str(bundle_noisy), "--questions", str(qs), "--methods", "ov-cb", "--out",
                 str(tmp_path / "o")]) == 2
    assert "--concurrency only" in capsys.readouterr().err


def test_bench_ttft_mode(bundle_noisy, tmp_path, capsys):
    """--ttft: prompts of the given lengths cut from the question texts, one token per method, --repeats
    rounds; each record's first token is the one the pipeline itself generates from that prompt."""
    import specexport
    from specexport.bench.ttft import prompt_stream

    qs = write_questions(tmp_path / "q.jsonl", [("writing", "hello world, hello world " * 20), ("math", "1 2 3 " * 30)])
    out = tmp_path / "out"
    methods = ["se-none", "se-recycle-k2"]
    assert main(["bench", str(bundle_noisy), "--questions", str(qs), "--ttft", "5,30", "--repeats", "2",
                 "--methods", ",".join(methods), "--out", str(out)]) == 0
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert {(r["prompt_tokens"], r["method"]) for r in records} == {(n, m) for n in (5, 30) for m in methods}
    assert all(len(r["seconds_runs"]) == 2 and r["seconds"] > 0 and r["same_first_token"] for r in records)
    pipe = specexport.load(bundle_noisy)
    ids, at = prompt_stream(pipe, qs, 64 + 2 * 35), 64
    for rnd in range(2):  # each (round, length) its own stretch of the stream, in the grid's order
        for n in (5, 30):
            want = pipe.generate(ids[at:at + n], max_new_tokens=1).token_ids[:1]
            assert all(r["first_tokens"][rnd] == want for r in records if r["prompt_tokens"] == n)
            at += n
    table = (out / "summary.md").read_text()
    assert "| prompt tokens | se-none | se-recycle-k2 | se-recycle-k2 vs se-none |" in table
    assert "| 30 | " in table
    for argv, msg in [(["--ttft", "1"], "lengths >= 2"), (["--ttft", "9", "--concurrency", "1"], "separate modes"),
                      (["--ttft", "100000"], "hold only")]:
        assert main(["bench", str(bundle_noisy), "--questions", str(qs), "--methods", "se-none", "--out",
                     str(tmp_path / "o"), *argv]) == 2
        assert msg in capsys.readouterr().err
