"""The ``talon generate`` command: the happy path and one clear error line per kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from talon_sd import SpeculativeGenerator, TalonError
from talon_sd.cli import main
from test_models import save_tiny_llama


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target = save_tiny_llama(root / "target", vocab=64, seed=0)
    draft = save_tiny_llama(root / "draft", vocab=64, seed=1)
    other = save_tiny_llama(root / "other", vocab=48, seed=2)
    corrupt = save_tiny_llama(root / "corrupt", vocab=64, seed=3)
    for weights in corrupt.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    return {"target": str(target), "draft": str(draft), "other": str(other), "corrupt": str(corrupt)}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TALON_SD_CACHE", str(tmp_path / "cache"))


def generate(folders, *extra, prompt="w3 w4 w5 w3 w4", target=None, draft=None):
    return main(["generate", prompt, "--target", target or folders["target"], "--draft", draft or folders["draft"],
                 "--dtype", "float32", "--device", "cpu", "--max-new-tokens", "12",
                 "--cpu-kernels", "packed", *extra])  # pinned: each call loads the models anew (auto times them)


def test_json_output_is_exactly_one_object_and_matches_ar(folders, capsys):
    outputs = {}
    for tree in ("ar", "talon", "eagle"):
        assert generate(folders, "--tree", tree, "--json", "--no-chat-template") == 0
        stdout = capsys.readouterr().out
        assert stdout.count("\n") == 1
        payload = json.loads(stdout)
        assert set(payload) == {"text", "token_ids", "finish_reason", "stop_reason", "stats", "cpu_kernels"}
        assert payload["cpu_kernels"]["target"] == "packed"  # as pinned by generate()
        assert payload["stats"]["new_tokens"] == len(payload["token_ids"]) > 0
        outputs[tree] = payload["token_ids"]
    assert outputs["talon"] == outputs["ar"] == outputs["eagle"]


def test_streaming_prints_text_then_a_stats_line(folders, capsys):
    assert generate(folders, "--tree", "talon") == 0
    captured = capsys.readouterr()
    assert captured.out.strip()
    assert "MAT" in captured.err and "delta" in captured.err


BAD_INPUTS = [
    ({"prompt": ""}, "prompt"),
    ({"prompt": "   "}, "prompt"),
    ({"extra": ["--max-new-tokens", "0"]}, "max_new_tokens"),
    ({"extra": ["--max-new-tokens", "-3"]}, "max_new_tokens"),
    ({"extra": ["--budget", "1"]}, "budget"),
    ({"extra": ["--mu", "0"]}, "mu"),
    ({"extra": ["--mu", "1.5"]}, "mu"),
    ({"extra": ["--topk", "0"]}, "topk"),
    ({"extra": ["--temperature", "-1"]}, "temperature"),
    ({"extra": ["--temperature", "nan"]}, "temperature"),
    ({"extra": ["--top-p", "0"]}, "top_p"),
    ({"extra": ["--top-p", "1.5"]}, "top_p"),
    ({"extra": ["--tree", "beam"]}, "tree"),
    ({"extra": ["--dtype", "int3"]}, "dtype"),
    ({"draft": "other"}, "draft"),
    ({"target": "no-such-model-name"}, "target"),
    ({"target": "/no/such/folder"}, "target"),
    ({"target": "corrupt"}, "target"),
    ({"prompt": " ".join(["w5"] * 200)}, "prompt"),
]


@pytest.mark.parametrize("case,argument", BAD_INPUTS, ids=[f"{a}-{i}" for i, (_, a) in enumerate(BAD_INPUTS)])
def test_bad_input_is_one_clear_line_and_exit_2(folders, capsys, case, argument):
    target = folders.get(case.get("target"), case.get("target"))
    draft = folders.get(case.get("draft"), case.get("draft"))
    code = generate(folders, *case.get("extra", []), "--no-chat-template", prompt=case.get("prompt", "w3 w4"),
                    target=target, draft=draft)
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"talon: error: {argument}"), lines[0]
    assert "Traceback" not in captured.err and captured.out == ""


def test_api_errors_leave_the_generator_usable(folders):
    generator = SpeculativeGenerator(folders["target"], folders["draft"], dtype="float32", device="cpu", chat_template=False)
    before = generator.generate("w3 w4 w5", max_new_tokens=10).token_ids
    for bad in ({"temperature": -1.0, "do_sample": True}, {"top_p": 0.0}, {"max_new_tokens": 0}, {"tree": "nope"},
                {"warp_speed": 9}):
        with pytest.raises(ValueError):
            generator.generate("w3 w4 w5", **bad)
    with pytest.raises(TalonError, match="prompt"):
        generator.generate("")
    # a generation abandoned half-way leaves nothing behind either
    stream = generator.stream("w3 w4 w5", max_new_tokens=10)
    next(iter(stream))
    assert generator.generate("w3 w4 w5", max_new_tokens=10).token_ids == before


def test_entry_point_exits_2_without_traceback():
    completed = subprocess.run([sys.executable, "-m", "talon_sd", "generate", "", "--max-new-tokens", "4"],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip() == "talon: error: prompt: got '', expected a non-empty string"
