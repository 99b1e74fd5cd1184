"""The shipped systemd units: every process is restarted for ever, and systemd accepts the units as written."""

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SERVICES = [
    "cairn-web.service",
    "cairn-streams.service",
    "cairn-mcp.service",
    "cairn-worker@.service",
    "cairn-replies@.service",
    "cairn-scheduler.service",
]


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(DEPLOY / name)
    return parser


@pytest.mark.parametrize("name", SERVICES)
def test_each_process_is_restarted_for_ever(name):
    unit = _unit(name)

    assert unit["Service"]["Restart"] == "always"
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"  # systemd never gives up on it
    assert unit["Unit"]["PartOf"] == "cairn.target"
    assert unit["Service"]["EnvironmentFile"] == "/etc/cairn/cairn.env"


def test_the_target_starts_web_streams_mcp_two_workers_a_replies_only_worker_and_one_scheduler():
    wants = _unit("cairn.target")["Unit"]["Wants"].split()

    assert sorted(wants) == sorted(
        [
            "cairn-web.service",
            "cairn-streams.service",
            "cairn-mcp.service",
            "cairn-worker@1.service",
            "cairn-worker@2.service",
            "cairn-replies@1.service",
            "cairn-scheduler.service",
        ]
    )


def test_the_units_run_the_commands_the_readme_gives():
    commands = {name: _unit(name)["Service"]["ExecStart"] for name in SERVICES}

    assert commands["cairn-worker@.service"] == "/opt/cairn/.venv/bin/python worker.py"
    assert commands["cairn-replies@.service"] == "/opt/cairn/.venv/bin/python worker.py --replies-only"
    assert commands["cairn-scheduler.service"] == "/opt/cairn/.venv/bin/flask schedule run"
    assert "--worker-class gthread" in commands["cairn-web.service"]
    assert "--worker-class gevent" in commands["cairn-streams.service"]
    assert commands["cairn-mcp.service"] == "/opt/cairn/.venv/bin/flask mcp http --host 127.0.0.1 --port 8002"
    assert _unit("cairn-web.service")["Service"]["ExecStartPre"] == "/opt/cairn/.venv/bin/flask check"
    assert (ROOT / "worker.py").exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_units(tmp_path):
    """systemd-analyze verify, with /opt/cairn pointed at this checkout so every command exists."""
    for unit in DEPLOY.glob("cairn*"):
        text = unit.read_text().replace("/opt/cairn/.venv/bin", str(Path(sys.executable).parent))
        text = text.replace("/opt/cairn", str(ROOT)).replace(
            "/etc/cairn/cairn.env", str(DEPLOY / "cairn.env.example")
        )
        (tmp_path / unit.name).write_text(
            text.replace("User=cairn", "User=root").replace("Group=cairn", "Group=root")
        )
    names = [
        "cairn-web.service",
        "cairn-streams.service",
        "cairn-mcp.service",
        "cairn-worker@1.service",
        "cairn-replies@1.service",
        "cairn-scheduler.service",
    ]
    units = [str(tmp_path / n) for n in names]
    for template in ("cairn-worker", "cairn-replies"):
        (tmp_path / f"{template}@1.service").write_text((tmp_path / f"{template}@.service").read_text())

    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *units, str(tmp_path / "cairn.target")],
        capture_output=True,
        text=True,
    )

    assert result.returncode == 0 and result.stderr == "", result.stderr
