"""`specexport bench` end to end on a tiny bundle: records, the Spec-Bench-style table, the plot."""
import json

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
