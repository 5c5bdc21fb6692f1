// A type that does not implement `Backend` passed to `harness!`.
struct NotABackend;

concord_suites::harness!(NotABackend, name = "mine");
