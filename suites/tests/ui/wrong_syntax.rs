// `harness!` with an argument it does not know.
concord_suites::harness!(concord_shm::ShmBackend, nom = "mine");
