// `harness!` with a setting it does not know (a typo of `gpus_per_rank`).
concord_suites::harness!(concord_shm::ShmBackend, name = "mine", gpus = 1);
