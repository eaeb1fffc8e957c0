"""Where a sweep's runs train: the launchers' descriptors and the checks before a sweep (launchers), Ray's cluster
address and workers (ray_launcher, ray_worker), and the warm training workers of the local launchers (warm_pool).
May import runner.sweeps.sweep_config and .terms; not .plugins, .job, .report or .study."""
