"""Generate docs/engines.md from reports/engines/*.json (see nvfp4_engines.matrix).

python packages/nvfp4-engines/scripts/matrix.py record CERT.json ... --out reports/engines
python packages/nvfp4-engines/scripts/matrix.py render [--check]
"""

from nvfp4_engines.matrix import main

if __name__ == "__main__":
    raise SystemExit(main())
