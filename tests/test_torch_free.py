"""The core, simulator, traces and TUI packages must import where torch is not installed."""
import subprocess
import sys

BLOCK_TORCH = (
    "import sys, importlib.abc\n"
    "class _NoTorch(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'torch' or name.startswith('torch.'):\n"
    "            raise ImportError('torch is blocked in this test')\n"
    "sys.meta_path.insert(0, _NoTorch())\n"
)


def _stdout(code: str) -> str:
    """What `code` prints with torch blocked, asserting that it ran without error."""
    res = subprocess.run([sys.executable, "-c", BLOCK_TORCH + code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_engine_core_imports_without_torch():
    assert _stdout("import engine.core, engine; from engine import SamplingParams; print('ok')").strip() == "ok"


def test_scheduler_runs_without_torch():
    code = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "from core_helpers import make_requests, make_scheduler, run_to_completion\n"
        "s = make_scheduler()\n"
        "[s.add_request(r) for r in make_requests(4)]\n"
        "run_to_completion(s); print('torch' in sys.modules)\n"
    )
    assert _stdout(code).strip() == "False"


def test_lazy_llm_attribute_needs_torch_only_when_touched():
    out = _stdout("import engine\ntry:\n    engine.LLM\nexcept ImportError as e:\n    print('lazy', e)\n")
    assert out.startswith("lazy")


def test_every_module_of_the_torch_free_packages_imports_without_torch():
    code = (
        "import importlib, pkgutil\n"
        "import engine.core, sim, traces, tui\n"
        "names = []\n"
        "for pkg in (engine.core, sim, traces, tui):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        if not m.name.endswith('__main__'):\n"
        "            importlib.import_module(m.name); names.append(m.name)\n"
        "print(len(names), 'sim.core.simulator' in names, 'sim.cli' in names, 'tui.app' in names, 'traces.reader' in names)\n"
    )
    count, *found = _stdout(code).split()
    assert int(count) > 30 and found == ["True"] * 4


def test_engine_core_imports_nothing_from_the_engine_runtime():
    code = (
        "import importlib, pkgutil, sys\n"
        "import engine.core\n"
        "for m in pkgutil.walk_packages(engine.core.__path__, 'engine.core.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(sorted(n for n in sys.modules if n.startswith('engine.') and not n.startswith('engine.core')))\n"
    )
    assert _stdout(code).strip() == "[]"


def test_model_shapes_and_roofline_import_without_torch():
    out = _stdout("from engine.core.model_shapes import MODEL_CONFIGS\n"
                  "from sim.cost_models.roofline import model_shape\n"
                  "print(model_shape('llama-3.1-8b').max_positions, 'torch' in sys.modules)")
    assert out.split() == ["131072", "False"]
