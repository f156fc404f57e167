# A newcomer needs two targets: `make demo` and `make test`. Both create .venv if missing.
# The install is split by need: `make venv` / `make demo` install the core only (what the
# quick start and the demos import: confluent-kafka, fastavro, rocksdict, the embedded
# broker; ~150 MB, ~15 s with a warm pip cache); `make test` adds what the suite needs
# (pytest, ruff, mypy, pyspark, faust: ~1.2 GB).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CORE := $(VENV)/.installed-core
SUITE := $(VENV)/.installed-test

.PHONY: demo demo-crash test test-fast bench kafka kafka-cluster registry lint format clean venv wheel

venv: $(CORE)

$(CORE): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(CORE)

$(SUITE): pyproject.toml $(CORE)
	$(PY) -m pip install --quiet -e '.[dev,spark,faust]'
	touch $(SUITE)

# The wheel README's "pip install the wheel" means; `pip install dist/agents_stream-*.whl`
# installs the core (tests/packaging/test_wheel.py runs the quick start from it).
wheel:  ## dist/agents_stream-<version>-py3-none-any.whl
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip wheel --quiet --no-deps -w dist .
	@ls dist/agents_stream-*.whl

demo: venv  ## embedded broker + example worker + sample orders, prints receipts
	$(PY) examples/demo.py

demo-crash: venv  ## SIGKILL the payments worker mid-charge, restart it, check the ledger
	$(PY) examples/demo_crash.py

# `make test` runs the whole suite on the embedded broker and, on Apache Kafka 4.1
# (agents_stream/testing/kafka.py: java 17+, mvn for the first fetch), the broker tests
# of KAFKA_PATHS (integration; fault: crash, chaos, failover, zombie, broker restarts;
# the worker's startup checks of existing topics) plus every kafka_only test wherever it
# is (compaction, transactions). The other Spark, Faust and CLI broker tests run on the
# embedded broker only, and the long guarantee proofs (marked kafka_proof: chaos,
# failover, zombie, crash window, crashes) on Kafka only: the suite took 58 min on the 2-core CI
# machine with them on both. Without java/mvn the Kafka runs skip with one line.
# `make test KAFKA_PATHS=tests`: every other broker test on both.
KAFKA_PATHS ?= tests/integration,tests/fault,tests/cli/test_worker_startup.py
# The unit tests (no broker, ~4.5 min alone) run first, on both cores (pytest-xdist): ~2
# min off the suite; the broker suites after them stay serial (their fault tests time
# processes against each other).
test: $(SUITE)  ## the whole suite: unit, integration (embedded broker and Apache Kafka), fault injection, Spark
	$(PY) -m pytest -q -ra -p no:cacheprovider -n 2 tests/unit
	JAVA_TOOL_OPTIONS= PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -ra --broker=both --kafka-paths=$(KAFKA_PATHS) --ignore=tests/unit

test-fast: $(SUITE)  ## unit tests only
	$(PY) -m pytest -q tests/unit

bench: $(SUITE)  ## throughput and latency tables against baselines measured in the same run
	$(PY) -m pip install --quiet -e '.[dev,spark,faust,bench]'
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) bench/run_all.py

kafka: venv  ## Apache Kafka 4.x (KRaft, one node) in the foreground on :9092; jars fetched once with mvn
	$(PY) -m agents_stream.testing.kafka run $(KAFKA_ARGS)

kafka-cluster: venv  ## a three-node Apache Kafka cluster (RF 3, min ISR 2) in the foreground; jars as for `make kafka`
	$(PY) -m agents_stream.testing.cluster $(CLUSTER_ARGS)

registry: venv  ## Apicurio Registry (Confluent API under /apis/ccompat/v7, BACKWARD) in the foreground on :8081; fetched once with mvn
	$(PY) -m agents_stream.testing.registry run $(REGISTRY_ARGS)

lint: $(SUITE)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/ruff format --check agents_stream

format: $(SUITE)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format agents_stream

clean:
	rm -rf .agents-stream build dist *.egg-info spark-warehouse metastore_db
