"""Re-implementations of the public reference scorers, one module per reference, each citing its source.

Every benchmark's default score (``score``, the summary's headline columns) is one of these, so the numbers
``mmagent eval`` prints are comparable with the papers that used the same reference:

=================  ========================================================================================
module             reference (repository, file, commit)
=================  ========================================================================================
videomme_2024      EvolvingLMMs-Lab/lmms-eval lmms_eval/tasks/videomme/utils.py ``extract_characters_regex``
                   at d0c1eae7 (the last commit before 9ca4445d replaced it in 2026); the same rule as
                   BradyFU/Video-MME evaluation/eval_your_results.py (2024)
lmms_charades      EvolvingLMMs-Lab/lmms-eval lmms_eval/tasks/charades_sta/utils.py ``extract_time``, ``iou``
                   and ``_temporal_grounding_compute_metrics`` at 75571cfe (last changed in 26f1d8e3)
lmms_vstar         EvolvingLMMs-Lab/lmms-eval lmms_eval/tasks/vstar_bench/utils.py ``extract_answer_letter``
                   at 75571cfe (last changed in c7eaef37)
geobench           ekonwang/GeoVista eval/eval_infer_geolocation.py + eval/utils_level_wise_eval.py +
                   eval/utils_geocode.py at df320371 (last changed in b737d814)
geoestimation      TIBHannover/GeoEstimation classification/utils_global.py (``vectorized_gc_distance``,
                   ``gcd_threshold_eval``) at 10bde085
=================  ========================================================================================

Each module has ``SOURCE`` (a dict: repo, file, commit, functions) that the benchmark module exposes as
``REFERENCE`` and the eval runner writes into run.json and summary.json. These functions reproduce the
reference's behaviour (quirks included, each one named where it is implemented); they are written here from
reading the source, not copied. Rules of our own (the lenient parsers in :mod:`mmagent.eval.parsing`) are
reported beside them as extra, clearly named columns, never in their place.
"""
