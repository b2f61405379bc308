# Set-up and everyday commands. `make demo` and `make test` work on a fresh clone.
VENV ?= .venv
PY := $(VENV)/bin/python
RELSEARCH := HF_HUB_OFFLINE=1 $(VENV)/bin/relsearch
DEMO_INDEX ?= demo-index
# the prepared public datasets (docs/datasets.md): $RELSEARCH_DATA, else this workspace's copy
DATA ?= $(or $(RELSEARCH_DATA),../shared/data)

.PHONY: demo demo-companies test test-bf16 test-fp32 test-slow test-kill test-dask test-browser docs test-docs pack company-bundle bench-speed gpu-report-data gpu-report clean

# torch==2.13.0 first: it is the CPU build on this machine's disk; a bare `torch` would pull CUDA wheels.
$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,bench]'
	touch $@

demo: $(VENV)/.installed
	$(RELSEARCH) index relsearch/data/sp500_2017.jsonl --index $(DEMO_INDEX)
	$(RELSEARCH) relations
	@echo; echo '# Competitors of Microsoft (similar-company), from the stored document:'
	$(RELSEARCH) query --id MSFT --index $(DEMO_INDEX) --relation similar-company -k 5
	@echo; echo '# Free text, plain cosine vs similar-company:'
	$(RELSEARCH) query "operates hospitals and outpatient surgery centers" --index $(DEMO_INDEX) -k 3
	$(RELSEARCH) query "operates hospitals and outpatient surgery centers" --index $(DEMO_INDEX) --relation similar-company -k 3
	@echo; echo '# Banks similar to JPMorgan, only within the Financials sector, with per-relation scores:'
	$(RELSEARCH) query --id JPM --index $(DEMO_INDEX) --relation similar-company --filter gics_sector=Financials -k 3 --explain

# The tour of docs/companies.md: the three-text Russell 3000 index (built once, minutes; skipped
# when $(COMPANY_INDEX) exists), then per anchor firm its similar-company top 5 with the recipe parts
# that placed each peer, beside plain cosine's top 5. Anchors only: the peers are what the index says.
COMPANY_INDEX ?= companies-index
COMPANY_ANCHORS ?= JPM KO XOM UNH MSFT
COMPANY_QUERY = $(RELSEARCH) query --index $(COMPANY_INDEX) -k 5 --fields name
# The tour's awk, over the table of one anchor's similar-company query (--explain); `cosine` holds
# the plain query's table. Columns split at two spaces; names padded to 24 characters, "…" counted once.
define COMPANY_TOUR
function pad(s, width, n) { n = length(s) - gsub(/[\200-\277]/, "&", s); while (n++ < width) s = s " "; return s }
BEGIN {
	rows = split(cosine, lines, "\n")
	for (i = 1; i <= rows; i++)
		if (split(lines[i], cell, "  +") > 6 && cell[2] ~ /^[0-9]+$$/) plain[cell[2]] = sprintf("%-6s %s", cell[4], cell[6])
}
/^anchor: / { printf "\n%s%-70s%s\n", pad(substr($$0, 9) "  ", 38), "similar-company: score = its parts", "plain cosine" }
/^ +[0-9]+  / { rank = $$2; hit = sprintf("%2d %-6s %s", $$2, $$4, pad($$6, 24)) }
/^      recipe:/ { sub(/^ +/, ""); gsub(/ \+ recipe:mentions:[a-z_]+=0\.000/, ""); gsub(/recipe:|same:gics_/, ""); gsub(/mentions:gics_/, "named:"); gsub(/_code=/, "="); printf "  %s  %-68s  %s\n", hit, $$0, plain[rank] }
endef
export COMPANY_TOUR
demo-companies: $(VENV)/.installed
	test -e $(COMPANY_INDEX) || $(RELSEARCH) index $(DATA)/russell3000_companies/corpus.jsonl --index $(COMPANY_INDEX) \
		--text-field text --text-field text_wikipedia --text-field text_bloomberg --collapse-field name
	@echo; echo '# relsearch query --id ID --index $(COMPANY_INDEX) -k 5 --fields name --relation similar-company --explain,'
	@echo '# its anchor line and per hit id, name and the parts of its score ("recipe:", "same:gics_", "_code" cut,'
	@echo '# "mentions:gics_" as "named:", a mentions bonus of 0 left out),'
	@echo '# beside the hit of the same rank without --relation (plain cosine, identity):'
	@for id in $(COMPANY_ANCHORS); do \
		cosine=$$($(COMPANY_QUERY) --id $$id) && recipe=$$($(COMPANY_QUERY) --id $$id --relation similar-company --explain) \
			|| exit 1; \
		printf '%s\n' "$$recipe" | LC_ALL=C awk -F '  +' -v cosine="$$cosine" "$$COMPANY_TOUR"; \
	done

# The linter first (configured in pyproject.toml [tool.ruff]): CI (.ci/run) runs this target.
test: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

# the default suite as an AVX-512 BF16 / AMX machine runs it (auto precision = bf16), on any CPU
test-bf16: $(VENV)/.installed
	RELSEARCH_TEST_AUTO_PRECISION=bf16 HF_HUB_OFFLINE=1 $(PY) -m pytest -q

# the default suite as an AVX2-only machine runs it (auto precision = fp32), on a bf16 CPU too
test-fp32: $(VENV)/.installed
	RELSEARCH_TEST_AUTO_PRECISION=fp32 HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-slow: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m slow

# SIGKILL at every named point of index / --append / delete / compact (docs/guarantees.md)
test-kill: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m killpoints

# index + lookup on Beam's DaskRunner against a dask scheduler and two worker processes on loopback
test-dask: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m dask -s

# The explorer page (/) and /docs in headless Chromium against a live relsearch serve on loopback (Debian: apt-get install chromium)
test-browser: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m browser tests/cli_api/test_browser.py

# The docs site: mkdocs (setup.cfg's docs extra, built-in readthedocs theme, no network) into
# $(SITE_DIR); README.md is its home page, mkdocs.yml its table of contents; --strict fails on a
# broken link or anchor.
SITE_DIR ?= site
$(VENV)/.docs-installed: $(VENV)/.installed setup.cfg
	$(PY) -m pip install -q --disable-pip-version-check -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-installed
	$(VENV)/bin/mkdocs build --strict --site-dir $(SITE_DIR)

# Every command of README.md and docs/*.md run as written, its printed output checked (marker
# `docs`, tests/test_docs.py; conventions in docs/testing.md); blocks marked skip are listed with
# their reasons. 5–10 min on 2 cores, most of it one `make demo`.
test-docs: $(VENV)/.docs-installed
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -rs -m docs tests/test_docs.py

pack: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(PY) tools/build_pack.py --data $(DATA) --out relsearch/pack

# Company-tuned encoder + similar-company / aspect operators (about 15 min on 2 cores; docs/companies.md)
company-bundle: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(PY) tools/build_company_bundle.py --data $(DATA) --out company-bundle

# GPU figures in one device call (docs/gpu-notes.md). Here, after ../shared/device/prepare.sh and
# tools/data/codex.py: the inputs that travel with the call (6.5 MiB: sentences, CoDEx-M by ids).
gpu-report-data: $(VENV)/.installed
	HF_HUB_OFFLINE=1 $(VENV)/bin/relsearch bench gpu-report-data --data $(DATA) --out .device/report

# On the GPU machine, right after `bash .device/install.sh`:
#   PYTHONPATH=/tmp/site make gpu-report PYTHON=python3 OUT=$OUT
# bench speed on the GPU and a 3-minute query-tower run on CoDEx-M, OUT/REPORT.md. The default model
# comes from .device/model when it is there (the machine lacks its PyPI package).
# tests/bench/test_gpu_report.py makes the same run on the CPU (--device cpu --tiny) on a tiny graph.
PYTHON ?= $(PY)
DEVICE ?= cuda
OUT ?= gpu-report
TINY ?=
gpu-report:
	RELSEARCH_DEFAULT_MODEL=$${RELSEARCH_DEFAULT_MODEL:-$$(test -d .device/model && echo $(CURDIR)/.device/model)} \
	HF_HUB_OFFLINE=1 $(PYTHON) -m relsearch bench gpu-report --device $(DEVICE) $(TINY) --data .device/report --out $(OUT)

clean:
	rm -rf $(DEMO_INDEX) .$(DEMO_INDEX).generations .$(DEMO_INDEX).lock build dist *.egg-info
