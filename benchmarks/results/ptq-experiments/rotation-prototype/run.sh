#!/bin/bash
# usage: run.sh FLOATDIR NAME [quantize flags...]
cd /work/main; export PYTHONPATH=src
f=$1; n=$2; shift 2
s=$(date +%s)
.venv/bin/python -m trit quantize $f /tmp/rot/$n --method gptq --device cpu --quiet "$@" > /tmp/rot/$n.qlog 2>&1 || { echo FAIL >> /tmp/rot/$n.qlog; exit 1; }
echo "quantize_s $(( $(date +%s) - s ))" > /tmp/rot/$n.res
.venv/bin/python -m trit eval /tmp/rot/$n --ppl wikitext2,gsm8k,python --device cpu --json /tmp/rot/$n.json 2>/dev/null | grep -v "^$" >> /tmp/rot/$n.res
