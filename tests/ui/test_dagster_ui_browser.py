"""The Dagster UI in a real browser (Playwright + Chromium): what a researcher does in `dagster dev`.

Starts `dagster dev` on a free port in a scratch DAGSTER_HOME and warehouse, then, in the UI: materializes the whole
graph on the embedded default (threshold partition 2.0), adds the threshold 1.5 from the launch dialog and
materializes the filter for it, opens the lineage graph, and reads the pages: descriptions, row counts, the speedup
histogram, the rejection counts and the asset checks. Afterwards both thresholds' tables sit side by side in DuckDB.
A second flow checks that mistakes and kills leave the UI truthful (issue #36): an unreadable source starts no run,
a SIGKILLed run is ended (canceled), and threshold partitions added as `2.00` or `abc` do not stay listed.

Screenshots go to tmp_path, and also to DICE_UI_SCREENSHOT_DIR when set (that is how benchmarks/results/ui_*.png are
made: `DICE_UI_SCREENSHOT_DIR=benchmarks/results pytest -m browser`). Install: see README ("Testing the UI").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
RUN_TIMEOUT_S = 420
UI_TIMEOUT_MS = 60_000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def dagster_dev(tmp_path, monkeypatch):
    """`dagster dev` on this project in a scratch home and warehouse; yields (base_url, instance, env)."""
    import dagster as dg

    from dice_pipeline.commands.dev import ensure_paper_threshold_partition
    from dice_pipeline.paths import kernelbench_tasks_path

    kernelbench = kernelbench_tasks_path()
    if kernelbench is None:
        pytest.skip("the curate stage needs KernelBench's tasks (DICE_KERNELBENCH_TASKS or ../shared/data/kernelbench)")
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "dice_pipeline" / "dagster.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DICE_WAREHOUSE_PATH": str(tmp_path / "w.duckdb"),
        "DICE_ARTIFACTS_DIR": str(tmp_path / "artifacts"),
        "DICE_CACHE_DIR": str(tmp_path / "cache"),
        "DICE_KERNELBENCH_TASKS": str(kernelbench),
    }
    env.pop("DICE_CONCUR_SOURCE", None)  # the embedded default
    for name in ("DAGSTER_HOME", "DICE_WAREHOUSE_PATH"):
        monkeypatch.setenv(name, env[name])
    instance = dg.DagsterInstance.get()
    ensure_paper_threshold_partition(instance)  # what `dice dev` does before it starts the UI

    port = _free_port()
    log = open(tmp_path / "dagster_dev.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-h", "127.0.0.1", "-p", str(port), "-w", str(ROOT / "workspace.yaml")],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(base_url + "/server_info", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail("dagster dev did not start:\n" + (tmp_path / "dagster_dev.log").read_text()[-4000:])
            time.sleep(1)
        yield base_url, instance, env
    finally:
        os.killpg(server.pid, signal.SIGINT)  # Ctrl-C: dagster dev stops its daemon, webserver and code server
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
        instance.dispose()


@pytest.fixture
def page(tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium_profile"),  # a fresh profile every time
            executable_path=os.environ.get("DICE_CHROMIUM", "/usr/bin/chromium"),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        context.set_default_timeout(UI_TIMEOUT_MS)
        try:
            yield context.new_page()
        finally:
            context.close()


def _open(page, url: str) -> None:
    page.goto(url, wait_until="networkidle", timeout=UI_TIMEOUT_MS)
    # A fresh profile gets Dagster's "Join the Dagster community" dialog once; it covers the page.
    skip = page.get_by_role("button", name="Skip")
    try:
        skip.wait_for(state="visible", timeout=4000)
        skip.click()
    except Exception:  # noqa: BLE001 - the dialog is shown at most once per profile
        pass


def _wait_for_runs(instance, partitions: set[str], timeout_s: float = RUN_TIMEOUT_S) -> None:
    """Wait until a successful run exists for each partition and no run is still going; fail on a failed run."""
    import dagster as dg

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = instance.get_runs()
        failed = [r for r in runs if r.status == dg.DagsterRunStatus.FAILURE]
        assert not failed, f"run {failed[0].run_id} failed; see its log in the UI"
        done = {r.tags.get("dagster/partition") for r in runs if r.status == dg.DagsterRunStatus.SUCCESS}
        if partitions <= done and all(r.is_finished for r in runs):
            return
        time.sleep(2)
    pytest.fail(f"runs for {sorted(partitions)} did not finish in {timeout_s:.0f}s: "
                f"{[(r.tags.get('dagster/partition'), r.status.value) for r in instance.get_runs()]}")


def _markdown_value(page, metadata_key: str):
    """A Markdown metadata value of the latest materialization: short ones are shown in the metadata table, long ones
    (pictures, previews) behind a "Show Markdown" button that opens a dialog. Returns (where it is shown, close)."""
    search = page.get_by_placeholder("Filter metadata keys")
    row = page.locator("tr", has=page.get_by_text(metadata_key, exact=True))
    for _ in range(60):  # the table renders only the rows in view, once the page around it has settled
        if search.input_value() != metadata_key:
            search.fill(metadata_key)
        search.evaluate("e => e.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(500)
        if row.count():
            break
    row = row.first
    button = row.get_by_text("Show Markdown")
    if not button.count():
        return row, lambda: None
    button.click()
    dialog = page.get_by_role("dialog").last
    dialog.wait_for(state="visible")

    def close():
        page.keyboard.press("Escape")
        dialog.wait_for(state="hidden")

    return dialog, close


def _screenshot(page, tmp_path, name: str) -> None:
    path = tmp_path / name
    page.screenshot(path=str(path))
    if os.environ.get("DICE_UI_SCREENSHOT_DIR"):
        target = Path(os.environ["DICE_UI_SCREENSHOT_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target / name)


def test_materialize_add_threshold_and_read_the_pages(dagster_dev, page, tmp_path):
    from playwright.sync_api import expect

    from warehouse import Warehouse

    base_url, instance, env = dagster_dev

    # 1. Materialize the data graph on the embedded default: the `dice_main` job (ingest -> verify -> filter ->
    # curate; training and evaluation are jobs of their own) -> "Materialize all" -> partition 2.0.
    _open(page, base_url + "/locations/__repository__@dice_pipeline/jobs/dice_main")
    page.get_by_role("button", name="Materialize all").first.click()
    launch = page.get_by_role("dialog").filter(has_text="Partition selection")
    launch.get_by_role("button", name="All", exact=True).click()
    expect(launch.get_by_text("1 partition", exact=True)).to_be_visible()
    launch.get_by_role("button", name=re.compile(r"^Launch")).click()
    expect(launch).to_be_hidden()
    _wait_for_runs(instance, {"2.0"})

    # 2. A new threshold from the UI: the filter's page -> Materialize -> "Add a partition" 1.5 -> launch.
    _open(page, base_url + "/assets/speedup_filtered_pairs")
    page.get_by_text(re.compile(r"^Materialize")).first.click()
    # The filter is one multi-asset: the UI says its sibling output is materialized too.
    extra = page.get_by_role("dialog").filter(has_text="Additional assets will be materialized")
    expect(extra.get_by_text("speedup_filter_decisions")).to_be_visible()
    extra.get_by_role("button", name="Confirm").click()
    launch = page.get_by_role("dialog").filter(has_text="Partition selection")
    launch.get_by_text("Add a partition").click()
    page.get_by_placeholder("name").fill("1.5")
    page.get_by_role("button", name="Save").click()
    expect(launch.get_by_text("1 partition", exact=True)).to_be_visible()
    launch.get_by_role("button", name="Launch 1 run").click()
    expect(launch).to_be_hidden()
    _wait_for_runs(instance, {"2.0", "1.5"})

    _read_the_pages(page, base_url, Warehouse(env["DICE_WAREHOUSE_PATH"]), tmp_path)


def _read_the_pages(page, base_url: str, wh, tmp_path: Path) -> None:
    """Flow 3 and what a person reads, after both thresholds are materialized; then the warehouse side by side."""
    from playwright.sync_api import expect

    counts = dict(wh.query("SELECT threshold_key, count(*) FROM filter.speedup_filtered_pairs GROUP BY 1").rows())
    ingested = wh.query("SELECT count(*) FROM ingest.concur_pairs").item()
    rejected = wh.query("SELECT count(*) FROM ingest.concur_rejects").item()

    # 3. The lineage graph.
    _open(page, base_url + "/asset-groups")
    page.get_by_role("button", name="settings", exact=True).click()  # the graph's options menu
    page.get_by_role("menuitem", name=re.compile("Expand all groups")).click()
    page.keyboard.press("Escape")
    for group in ("ingest", "verify", "filter", "synthesis", "cuke", "rl_data"):
        expect(page.get_by_text(group, exact=True).first).to_be_visible()
    page.get_by_role("button", name=re.compile("Hide navigation")).click()  # more room for the graph
    page.wait_for_timeout(1500)  # let the graph layout settle before the picture
    _screenshot(page, tmp_path, "ui_lineage.png")
    # A group's own graph fits the window whole (the global one grows past it as assets are added); long names are
    # shortened in the nodes.
    for group, names in (("ingest", ("concur_pairs", "concur_rejects")), ("verify", ("verified_pairs",))):
        _open(page, base_url + f"/locations/__repository__@dice_pipeline/asset-groups/{group}")
        for name in names:
            expect(page.get_by_text(name, exact=True).first).to_be_visible()

    # The filter's page: what it is and where it came from, its row count, its histogram, its checks.
    _open(page, base_url + "/assets/speedup_filtered_pairs")
    main = page.locator("main") if page.locator("main").count() else page.locator("body")
    expect(page.get_by_text(re.compile(r"at or above the partition's speedup threshold"))).to_be_visible()
    expect(page.get_by_text(re.compile(r"lineage\.filter_lineage")).first).to_be_visible()
    row_count = re.search(r"Row count\s+(\d+)", main.inner_text())
    assert row_count and int(row_count.group(1)) == counts["1.5"], (row_count, counts)  # the latest: 1.5
    _screenshot(page, tmp_path, "ui_filter_asset.png")
    histogram, close = _markdown_value(page, "speedup_histogram")
    image = histogram.locator("img[alt^='speedup used (threshold 1.5x)']")
    expect(image).to_be_visible()
    assert image.evaluate("img => img.naturalWidth") > 100  # a real picture, decoded
    page.wait_for_timeout(800)  # the dialog fades in
    _screenshot(page, tmp_path, "ui_filter_histogram.png")
    close()
    preview, close = _markdown_value(page, "preview")
    expect(preview.get_by_role("columnheader", name="speedup_used")).to_be_visible()
    close()

    _open(page, base_url + "/assets/speedup_filtered_pairs?view=checks")
    expect(page.get_by_text("Succeeded").first).to_be_visible()
    checks_list = page.locator("body").inner_text()
    for check in ("threshold_respected", "schema_matches", "non_empty"):  # the list: each check and its last result
        assert re.search(rf"{check}\s+Succeeded", checks_list), (check, checks_list[:2000])

    # The decisions: every drop has its reason, counted.
    _open(page, base_url + "/assets/speedup_filter_decisions")
    reasons, close = _markdown_value(page, "decisions_by_reason")
    decided = dict(wh.query("SELECT reason_code, count(*) FROM filter.speedup_filter_decisions "
                            "WHERE threshold_key = '1.5' GROUP BY 1").rows())
    for reason, count in decided.items():
        expect(reasons.get_by_role("row", name=re.compile(rf"^{reason} {count}\b"))).to_be_visible()
    close()
    plot, close = _markdown_value(page, "decisions_by_reason_plot")
    expect(plot.locator("img[alt^='decisions at threshold 1.5x']")).to_be_visible()
    close()

    # The verdicts: one per ingested pair, counted by status (the deliberately deceptive seeds are rejected there).
    _open(page, base_url + "/assets/verified_pairs")
    main = page.locator("main") if page.locator("main").count() else page.locator("body")
    row_count = re.search(r"Row count\s+(\d+)", main.inner_text())
    assert row_count and int(row_count.group(1)) == ingested
    statuses, close = _markdown_value(page, "verdicts_by_status")
    for status, count in wh.query("SELECT status, count(*) FROM verify.verified_pairs GROUP BY 1").rows():
        expect(statuses.get_by_role("row", name=re.compile(rf"^{status} {count}\b"))).to_be_visible()
    close()
    # Ingestion: where the rows came from, and its rejects (none in the embedded corpus: every seed row is valid).
    _open(page, base_url + "/assets/concur_rejects")
    main = page.locator("main") if page.locator("main").count() else page.locator("body")
    row_count = re.search(r"Row count\s+(\d+)", main.inner_text())
    assert row_count and int(row_count.group(1)) == rejected
    _open(page, base_url + "/assets/concur_pairs")
    expect(page.get_by_text(re.compile(r"embedded seed corpus")).first).to_be_visible()

    # Afterwards: both thresholds side by side in the warehouse, each deciding every ingested pair.
    assert set(counts) == {"1.5", "2.0"} and counts["1.5"] >= counts["2.0"] > 0
    per_threshold = dict(wh.query("SELECT threshold_key, count(*) FROM filter.speedup_filter_decisions "
                                  "GROUP BY 1").rows())
    assert per_threshold == {"1.5": ingested, "2.0": ingested}
    kept_at_2 = set(wh.query("SELECT uuid FROM filter.speedup_filtered_pairs WHERE threshold_key = '2.0'")
                    .to_series().to_list())
    kept_at_1_5 = set(wh.query("SELECT uuid FROM filter.speedup_filtered_pairs WHERE threshold_key = '1.5'")
                      .to_series().to_list())
    assert kept_at_2 <= kept_at_1_5


def _dice(env: dict, *args: str, **popen) -> subprocess.CompletedProcess | subprocess.Popen:
    """`dice ARGS` against the UI's home and warehouse; with `popen` keywords, started and returned unfinished."""
    command = [sys.executable, "-m", "dice_pipeline.cli", *args]
    if popen:
        return subprocess.Popen(command, cwd=ROOT, env=env, text=True, **popen)
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def _wait_for(condition, what: str, timeout_s: float = 120.0, every_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    pytest.fail(f"{what} did not happen in {timeout_s:.0f}s")


def test_mistakes_and_kills_leave_the_ui_truthful(dagster_dev, page, tmp_path, pair_factory):
    """Issue #36, items 1-3, as the UI shows them: an unreadable source fails before any run (no red run or
    partition for intact data); a run killed with SIGKILL is ended (canceled), not "Started" forever; a threshold
    partition added as `2.00` or `abc` does not stay listed."""
    import dagster as dg
    from playwright.sync_api import expect

    from assets import keys

    base_url, instance, env = dagster_dev
    threshold = keys.THRESHOLD_PARTITIONS.name
    built = _dice(env, "run")  # the embedded source at 2.0: intact data to keep intact
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (good_run,) = instance.get_runs()

    # 1. A source that exists but cannot be read: one line, exit 2, and no Dagster run at all.
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all\n")
    bad = _dice(env, "run", "--source", str(tmp_path / "bad.parquet"))
    assert bad.returncode == 2 and bad.stderr.startswith("dice run: source error: parquet source")
    assert [r.run_id for r in instance.get_runs()] == [good_run.run_id]
    _open(page, base_url + "/runs")
    expect(page.get_by_text(good_run.run_id[:8]).first).to_be_visible()
    expect(page.get_by_text("Failure", exact=True)).to_have_count(0)
    # partition 2.0 is materialized, not failed: what the asset's partitions view is drawn from
    assert _partition_stats(base_url, "speedup_filtered_pairs") == {"numMaterialized": 1, "numFailed": 0,
                                                                     "numMaterializing": 0, "numPartitions": 1}

    # 2. A run killed with SIGKILL mid-ingestion: the code location's sensor sees its process is gone.
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps(pair_factory(i)) + "\n" for i in range(30000)))
    killed = _dice(env, "run", "--source", str(big), "--allow-source-change", "--verbose",
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for line in killed.stderr:
            if "ingesting ConCuR pairs from" in line:
                break
        assert killed.poll() is None, "the run ended before it could be killed"
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=60)
    finally:
        if killed.poll() is None:
            killed.kill()
    (orphan,) = [r for r in instance.get_runs() if r.run_id != good_run.run_id]
    _wait_for(lambda: instance.get_run_by_id(orphan.run_id).status == dg.DagsterRunStatus.CANCELED,
              "the killed run ended by the orphaned_runs sensor", timeout_s=180)
    _open(page, base_url + f"/runs/{orphan.run_id}")
    expect(page.get_by_text("Canceled", exact=True).first).to_be_visible()
    expect(page.get_by_text("Started", exact=True)).to_have_count(0)
    expect(page.get_by_text(re.compile(r"the process running it \(pid \d+\) is gone")).first).to_be_visible()
    # and the filter's partition 2.0 keeps its materialization: the killed run wrote nothing
    assert _partition_stats(base_url, "speedup_filtered_pairs") == {"numMaterialized": 1, "numFailed": 0,
                                                                     "numMaterializing": 0, "numPartitions": 1}

    # 3. Thresholds: the command line refuses a bad one in one line; in the UI, partitions added as `2.00` or
    # `abc` are replaced by their canonical key or deleted by the threshold_partition_keys sensor.
    for bad_threshold in ("-1", "0", "abc"):
        refused = _dice(env, "run", "--threshold", bad_threshold)
        assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
        assert "Traceback" not in refused.stderr
    _open(page, base_url + "/assets/speedup_filtered_pairs")
    page.get_by_text(re.compile(r"^Materialize")).first.click()
    page.get_by_role("dialog").filter(has_text="Additional assets will be materialized").get_by_role(
        "button", name="Confirm").click()
    launch = page.get_by_role("dialog").filter(has_text="Partition selection")
    for key in ("2.00", "abc"):
        launch.get_by_text("Add a partition").click()
        page.get_by_placeholder("name").fill(key)
        page.get_by_role("button", name="Save").click()
    page.keyboard.press("Escape")  # close the launch dialog without launching
    _wait_for(lambda: set(instance.get_dynamic_partitions(threshold)) == {"2.0"},
              "the partitions 2.00 and abc taken out by the sensor", timeout_s=120)
    _open(page, base_url + "/assets/speedup_filtered_pairs?view=partitions")
    expect(page.get_by_text("2.0", exact=True).first).to_be_visible()
    for key in ("2.00", "abc"):
        expect(page.get_by_text(key, exact=True)).to_have_count(0)


def _partition_stats(base_url: str, asset: str) -> dict:
    """The partition counts the UI shows for an asset (materialized, failed, in progress), from its GraphQL API."""
    query = ('{ assetNodeOrError(assetKey: {path: ["%s"]}) { ... on AssetNode { partitionStats { numMaterialized '
             'numFailed numMaterializing numPartitions } } } }' % asset)
    request = urllib.request.Request(base_url + "/graphql", data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["data"]["assetNodeOrError"]["partitionStats"]

