// `harness!` without `name = "..."`.
concord_suites::harness!(concord_shm::ShmBackend);
