"""The PandaStack example of the seed article, verbatim, against a live server.

Uses the `live_server` fixture of tests/e2e (a real `pandastack serve`). The `code-interpreter`
template has pandas and pyarrow installed, so the example's `pip install` finds them satisfied
and needs no network (the test servers give guests no DNS).
"""

from __future__ import annotations

import pytest

from pandastack import Client, NotFoundError
from pandastack.wire.sandboxes import ENDED_STATES
from tests.e2e.conftest import LiveServer

# What "the model" wrote: reads nothing, writes the report the example downloads.
MODEL_OUTPUT = """\
import pandas as pd

df = pd.DataFrame({"x": [1, 2, 3], "y": [2, 4, 6]})
df["z"] = df["x"] * df["y"]
df.to_parquet("/work/frame.parquet")  # needs pyarrow, installed by the example
pd.read_parquet("/work/frame.parquet").to_csv("/work/report.csv", index=False)
print("rows", len(df))
"""


@pytest.fixture
def live_env(live_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Configure the SDK for the live server through the environment only, as a user would."""
    monkeypatch.setenv("PANDASTACK_API", live_server.api_url)
    monkeypatch.setenv("PANDASTACK_API_KEY", live_server.api_key)


@pytest.mark.e2e
@pytest.mark.vm
@pytest.mark.timeout(1500)
def test_seed_article_example(live_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    model_output = MODEL_OUTPUT

    # ---- verbatim from the seed article (only indented into this function) ----
    from pandastack import Sandbox

    # ttl_seconds is the backstop for the day your process dies mid-loop and
    # never reaches the cleanup path. Always set it. Ask me how I know.
    with Sandbox.create(template="code-interpreter", ttl_seconds=900) as sbx:
        # The model wrote this. Nobody has read it. That is the entire point
        # of it running over there instead of in your API process.
        sbx.filesystem.write("/work/analysis.py", model_output)

        setup = sbx.exec("pip install pandas pyarrow", timeout_seconds=300)
        if setup.exit_code != 0:
            raise RuntimeError(setup.stderr)

        run = sbx.exec("python /work/analysis.py", timeout_seconds=600)
        print(run.exit_code, run.stdout[:2000], run.stderr[:2000])

        report = sbx.filesystem.read("/work/report.csv")  # bytes
        print(report.decode("utf-8")[:500])

    # The context manager kills the sandbox. If you are not using it,
    # call sbx.kill() in a finally block and mean it.
    # ---- end of the article's code ----

    printed = capsys.readouterr().out
    assert printed.startswith("0 rows 3"), printed
    assert "x,y,z\n1,2,2\n2,4,8\n3,6,18" in printed
    with Client() as client:
        try:
            state = client.sandboxes.get(sbx.id).state
        except NotFoundError:
            state = "killed"
    assert state in ENDED_STATES
