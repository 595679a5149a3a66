.PHONY: setup demo test bench-ps
setup:
	bash scripts/setup.sh
demo:
	bash scripts/demo.sh
test:
	bash scripts/test.sh
bench-ps:
	.venv/bin/python -m bench.ps
