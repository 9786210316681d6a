"""Is the map an explanation? Run-level checks beside plausibility, as Lightning callbacks that
``xbench.test`` adds to every run (off unless asked for):

- `Sanity` (``--sanity.*``): cascading model-parameter randomisation
  (Adebayo et al., 2018) -- does the map change when the model's weights are re-initialised?
- `Faithfulness` (``--faithfulness.*``): deletion and insertion
  (RISE) and ROAD -- do the pixels the map ranks highest drive the model's score?
- `Robustness` (``--robustness.*``): max-sensitivity (Yeh et al., 2019) and the local Lipschitz
  estimate (Alvarez-Melis & Jaakkola, 2018) -- does the map stay put under small input noise?

Each works on whatever maps the model's ``forward`` returns, on a subset of the split's images (the
same for every model), and hands its ``metrics.json`` section and per-pair records to the model
(``XBenchModel.checks``) in ``on_test_epoch_end``, before the model's own results are made. The
definitions, defaults and costs: ``docs/explanations.md``.
"""
