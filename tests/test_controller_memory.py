"""What the online controller learned, kept between processes (:mod:`talon_sd.controller_memory`): the round
trip, the key it must match, damaged files and files of another shape, and ``talon generate`` reading and writing
it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from talon_sd import SpeculativeGenerator
from talon_sd.cli import main
from talon_sd.control import BudgetController
from talon_sd.controller_memory import load_memory, memory_key, memory_path, save_memory
from talon_sd.errors import TalonWarning
from talon_sd.machine import isa_of_cpuinfo, machine_key
from test_models import save_tiny_llama

PROMPT = "w3 w4 w5 w3 w4"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory-models")
    return {"target": str(save_tiny_llama(root / "target", vocab=64, seed=0)),
            "draft": str(save_tiny_llama(root / "draft", vocab=64, seed=1))}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TALON_SD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def auto_generator(folders) -> SpeculativeGenerator:
    return SpeculativeGenerator(folders["target"], folders["draft"], tree="talon", dtype="float32", device="cpu",
                                chat_template=False, cpu_kernels="packed", quantize="none")


def test_memory_round_trip_starts_a_new_generator_where_the_last_one_stopped(folders):
    first = auto_generator(folders)
    plain = first.generate(PROMPT, max_new_tokens=24, tree="ar").token_ids
    assert first.generate(PROMPT, max_new_tokens=24).token_ids == plain
    key = memory_key(first, folders["target"], folders["draft"])
    path = save_memory(first, key)
    assert path == memory_path(key) and path.is_file()

    second = auto_generator(folders)
    assert second.controller_memory() == {}
    memory = load_memory(memory_key(second, folders["target"], folders["draft"]))
    assert memory is not None and set(memory) == set(first.controller_memory()) == {("talon", "model", False)}
    second.restore_controller_memory(memory)
    learned, restored = first.controller_memory()[("talon", "model", False)], memory[("talon", "model", False)]
    assert restored is not learned and restored.to_dict() == learned.to_dict()
    # the next call runs a copy of the restored controller (its costs go on growing) and stays lossless
    assert second.generate(PROMPT, max_new_tokens=24).token_ids == plain
    assert second.controller_memory()[("talon", "model", False)].verify.adds > restored.verify.adds


def test_a_fixed_budget_or_nothing_learned_saves_nothing(folders):
    fixed = SpeculativeGenerator(folders["target"], folders["draft"], tree="talon", budget=8, dtype="float32",
                                 device="cpu", chat_template=False, cpu_kernels="packed")
    fixed.generate(PROMPT, max_new_tokens=8)
    key = memory_key(fixed, folders["target"], folders["draft"])
    assert save_memory(fixed, key) is None
    assert not memory_path(key).exists()


def test_memory_of_another_machine_model_or_dtype_is_not_used(folders):
    generator = auto_generator(folders)
    generator.generate(PROMPT, max_new_tokens=16)
    key = memory_key(generator, folders["target"], folders["draft"])
    save_memory(generator, key)
    assert load_memory(key) is not None
    for change in ({"isa": "avx512_bf16" if key["isa"] != "avx512_bf16" else "avx2"}, {"threads": key["threads"] + 1},
                   {"dtype": "bfloat16"}, {"draft": folders["target"]}, {"torch": "0.0"},
                   {"talon_sd": "0.0.0"}):
        other = {**key, **change}
        assert load_memory(other) is None, change
        # even a file of the other key's name that holds this key's memory is refused
        memory_path(other).parent.mkdir(parents=True, exist_ok=True)
        memory_path(other).write_bytes(memory_path(key).read_bytes())
        assert load_memory(other) is None, change
    assert memory_path(key).suffix == ".json" and json.loads(memory_path(key).read_text())["key"] == key


def test_a_damaged_file_warns_and_starts_afresh(folders):
    generator = auto_generator(folders)
    key = memory_key(generator, folders["target"], folders["draft"])
    path = memory_path(key)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x80\x05not json")
    with pytest.warns(TalonWarning, match="cannot use"):
        assert load_memory(key) is None


@pytest.mark.parametrize("damage", [lambda state: state.update(version=0),  # another version of the controller
                                    lambda state: state["values"].pop(),  # another layout
                                    lambda state: state["settings"].update(leave_plain_margin=0.1)])  # old settings
def test_a_controller_of_another_version_or_layout_is_not_used(folders, damage):
    generator = auto_generator(folders)
    generator.generate(PROMPT, max_new_tokens=16)
    key = memory_key(generator, folders["target"], folders["draft"])
    path = save_memory(generator, key)
    saved = json.loads(path.read_text())
    damage(saved["controllers"][0]["state"])
    path.write_text(json.dumps(saved))
    with pytest.warns(TalonWarning, match="cannot use"):
        assert load_memory(key) is None


def test_an_unwritable_cache_warns_and_costs_nothing_else(folders, private_cache):
    generator = auto_generator(folders)
    generator.generate(PROMPT, max_new_tokens=8)
    private_cache.mkdir(parents=True)
    (private_cache / "controllers").write_text("a file where the folder should be")
    with pytest.warns(TalonWarning, match="cannot write"):
        assert save_memory(generator, memory_key(generator, folders["target"], folders["draft"])) is None


@pytest.mark.parametrize("flags, expected", [
    ("fpu sse2 avx2 fma", "avx2"),
    ("fpu avx2 avx512f avx512bw", "avx512"),
    ("avx2 avx512f avx512_bf16", "avx512_bf16"),
    ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "amx"),
    ("fpu sse2", "other"),
])
def test_the_machine_key_tells_cpu_kinds_of_one_model_name_apart(flags, expected):
    assert isa_of_cpuinfo(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n") == expected
    assert isa_of_cpuinfo("no flags line") == "other"
    assert set(machine_key("cpu")) == {"cpu", "isa", "threads", "device"}


def test_the_core_names_machines_and_memory_files_without_the_benchmark_package():
    # the dependency runs one way: bench builds on the core, never the reverse
    code = ("import sys; from talon_sd import controller_memory, machine, models; "
            "key = {**machine.machine_key('cpu'), 'target': machine.model_name(None, 'target'), "
            "'draft': machine.model_name(None, 'draft'), 'dtype': 'float32'}; "
            "assert controller_memory.memory_path(key).name.startswith('qwen2.5-coder-1.5b-instruct--'); "
            "models.cpuinfo_has_fast_bfloat16('flags : avx2'); "
            "loaded = [m for m in sys.modules if m.startswith('talon_sd.bench')]; assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True)


def cli(folders, *extra):
    return main(["generate", PROMPT, "--target", folders["target"], "--draft", folders["draft"], "--dtype", "float32",
                 "--device", "cpu", "--cpu-kernels", "packed", "--max-new-tokens", "12", "--no-chat-template",
                 "--json", *extra])


def test_talon_generate_reads_and_writes_the_memory(folders, private_cache, capsys, monkeypatch):
    assert cli(folders) == 0
    files = list((private_cache / "controllers").glob("*.json"))
    assert len(files) == 1
    first = load_memory_of(files[0])
    restored = []
    original = SpeculativeGenerator.restore_controller_memory
    monkeypatch.setattr(SpeculativeGenerator, "restore_controller_memory",
                        lambda self, memory: (restored.append(memory), original(self, memory)))
    assert cli(folders) == 0
    assert len(restored) == 1  # what was saved
    assert restored[0][("talon", "model", False)].to_dict() == first.to_dict()
    second = load_memory_of(files[0])
    assert second.verify.adds > first.verify.adds  # the second run's steps were added to what it loaded
    capsys.readouterr()


def test_fresh_controller_and_fixed_budgets_neither_read_nor_write(folders, private_cache, capsys, monkeypatch):
    monkeypatch.setattr(SpeculativeGenerator, "restore_controller_memory",
                        lambda self, memory: pytest.fail("memory read"))
    assert cli(folders, "--fresh-controller") == 0
    assert cli(folders, "--budget", "8") == 0
    assert cli(folders, "--tree", "ar") == 0
    assert not (private_cache / "controllers").exists()
    capsys.readouterr()


def load_memory_of(path) -> BudgetController:
    [row] = json.loads(path.read_text())["controllers"]
    assert (row["method"], row["drafter"], row["sampled"]) == ("talon", "model", False)
    return BudgetController.from_dict(row["state"])
