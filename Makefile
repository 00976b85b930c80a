# Platform Gateway — the two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt pyproject.toml | cksum | cut -d' ' -f1)
QUEUES := default,analytics,embeddings,email,bulk,seed
APT    := $(if $(filter 0,$(shell id -u)),apt-get,sudo apt-get)
export FLASK_APP := wsgi

.PHONY: install migrate run worker flower stack stack-tools test bench bench-tools lint clean

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ required"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
# the project itself, editable: `celery`, `flask`, `gunicorn` import it from any directory
	$(BIN)/python -m pip install --quiet --no-deps -e .
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

stack: install stack-tools      ## compose's topology as processes (Procfile, honcho): ingress on :$${STACK_PORT:-8080}
	$(BIN)/python -m stack up

stack-tools:                    ## nginx and redis-server (Debian) for `make stack` and tests/deploy, installed when missing
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { echo "installing nginx" >&2; \
		$(APT) update -qq && DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq --no-install-recommends nginx; }
	@command -v redis-server >/dev/null || { echo "installing redis-server" >&2; \
		$(APT) update -qq && DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq --no-install-recommends redis-server; }

test: install                   ## the whole suite against real PostgreSQL (+ Redis when REDIS_URL is set)
	@$(MAKE) --no-print-directory stack-tools || echo "nginx/redis-server not installed: tests/deploy will be skipped" >&2
	$(BIN)/python -m pytest

bench: migrate bench-tools      ## benchmarks; tables land in bench/results/
	$(BIN)/python -m bench

bench-tools:                    ## wrk (Debian) for the HTTP benchmark, installed when missing
	@command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; } \
		|| { command -v sudo >/dev/null && sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; }

lint: install
	$(BIN)/ruff check app workers migrations tests bench stack
	$(BIN)/lint-imports  # the import contracts of pyproject.toml (also run by tests/unit/test_architecture.py)

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
