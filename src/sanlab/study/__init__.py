"""Controlled studies (SPEC §1.2–1.4): matched arms, per-arm LR sweeps with boundary
extension, seeds and budgets, local and SLURM runners, the results store and the gap
table, the noise rule (`noise`) and the results as data (`results`, which the report and
the records render). `sanlab study plan|run|status|table` is the command line
(`sanlab.commands.study`)."""
