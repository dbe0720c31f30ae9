import sys, torch
from dataclasses import replace
from trit.calibrate import CalibOptions, sample_cache_path, _write_samples
ids = torch.load("/root/.cache/trit/calib/cd575de6cf4049c6d4d4bcd4edde43fc.pt")
for d in sys.argv[1:]:
    for n in (32, 128):
        p = sample_cache_path(d, replace(CalibOptions(), samples=n), "cpu")
        if not p.exists():
            _write_samples(p, ids[:n].clone()); print(d, n, p)
