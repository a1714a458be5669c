"""memalloc in Jupyter: tests/notebooks/display.ipynb (memalloc enabled on
the host backend, a leaky loop under leak_check, memory_breakdown(), a
batch plan, a step tracker) executed by nbclient in a real IPython kernel;
each object's cell must come back as text/html (``_repr_html_``,
memalloc/reporters/notebook.py) carrying the figures the cell printed or
the loop planted, and a short text/plain repr. Needs nbclient, nbformat and
ipykernel: skipped without them, except where MEMALLOC_REQUIRE_LIBRARIES=1
(CI, .ci/run installs them), where their absence fails.
tests/unit/test_notebook_html.py checks the HTML itself in this process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
from memtest_helpers import REPO

from memalloc.core._format import fmt_bytes

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "display.ipynb"
LIBRARIES = ("nbclient", "nbformat", "ipykernel")
_missing = [m for m in LIBRARIES if importlib.util.find_spec(m) is None]
if _missing and os.environ.get("MEMALLOC_REQUIRE_LIBRARIES") == "1":
    raise RuntimeError(
        f"MEMALLOC_REQUIRE_LIBRARIES=1 but {', '.join(_missing)} not installed: pip install {' '.join(LIBRARIES)}"
    )
pytestmark = pytest.mark.skipif(
    bool(_missing), reason=f"executing a notebook needs {', '.join(_missing)}: pip install {' '.join(LIBRARIES)}"
)
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")


def titles(html: str) -> list[str]:
    return re.findall(r'title="([^"]*)"', html)


def exact(n: int, suffix: str = "") -> str:
    return f"{n:,} bytes{suffix}"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook's code cells after a run: (printed text, html, plain) each."""
    import nbclient
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = {"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    saved = {k: os.environ.get(k) for k in (*env, "MEMALLOC_CONF")}
    os.environ.update(env)  # the kernel inherits this process's environment: the host backend, this checkout
    os.environ.pop("MEMALLOC_CONF", None)
    try:
        cwd = tmp_path_factory.mktemp("notebook")
        client = nbclient.NotebookClient(
            nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
        )
        client.execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        assert not [o for o in cell.outputs if o.output_type == "error"], cell.outputs
        printed = "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")
        shown = [o for o in cell.outputs if o.output_type == "execute_result"]
        html = shown[0].data.get("text/html", "") if shown else ""
        plain = shown[0].data.get("text/plain", "") if shown else ""
        cells.append((cell.source, printed, html, plain))
    return cells


def test_each_object_renders_as_html_in_jupyter(executed):
    setup, leak, breakdown, plan, tracker = executed
    assert setup[2] == ""  # the setup cell shows nothing

    source, _, html, plain = leak
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "# LEAK" in text)
    assert 'class="memalloc-nb memalloc-leak-report"' in html and "1 leak" in html
    assert exact(12 * 8192) in titles(html)  # retained: the 12 tensors of 8 KiB the loop kept
    rate = [float(t.split()[0].replace(",", "")) for t in titles(html) if t.endswith(" bytes/step")]
    assert rate and 0.9 * 8192 <= rate[0] <= 1.2 * 8192, rate  # the fitted growth, about 8 KiB a step
    assert f"{fmt_bytes(rate[0])}/step" in html
    assert f":{line} " in html and "kept.append(torch.ones(2048))" in html  # the cell's line and its text
    assert plain.startswith("<memalloc.leak_check: memalloc LeakReport host device 0, 12 steps: 1 leak, +")

    _, printed, html, plain = breakdown
    b = json.loads(printed)
    for c in CATEGORIES:
        assert f"c-{c}" in html and exact(b["now"][c]) in titles(html) and exact(b["peak"][c]) in titles(html)
    assert sum(b["peak"].values()) == b["peak_total"] and exact(b["peak_total"]) in titles(html)
    assert b["peak"]["parameters"] > 0 and b["peak"]["activations"] > 0
    assert plain.startswith(f"<memalloc MemoryBreakdown device 0: {fmt_bytes(b['now_total'])} allocated now")

    _, printed, html, plain = plan
    p = json.loads(printed)
    assert f"<b>{p['batch']}</b>" in html and exact(64 << 20) in titles(html)
    assert exact(p["peak_reserved"]) in titles(html) and exact(p["peak_allocated"]) in titles(html)
    assert plain.startswith(f"<memalloc BatchPlan: batch {p['batch']} fits 64.00 MiB")

    _, printed, html, plain = tracker
    rows = json.loads(printed)
    assert len(rows) == 6 and exact(max(r["peak_allocated"] for r in rows)) in titles(html) and "<svg" in html
    assert plain.startswith("<memalloc.StepTracker device=0 stopped, 6 rows")
