-- Every retry policy version Herald has run with, as it was: an attempt records the version
-- that decided it (`herald_attempts.policy_version`, `NAME@hash`), and this keeps what that
-- version was, so that an explanation states the budget the message's attempts were decided by
-- — after the configuration changed, and from `herald explain` run with another configuration
-- than the server's. Written at every start (`herald serve`, `herald migrate`), a row per
-- version, never changed: the hash covers the parameters.
CREATE TABLE herald_retry_policies (
    version      TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    max_attempts INTEGER NOT NULL,
    -- The parameters, for people: `{"base_ms", "cap_ms", "jitter", "retry_after_max_ms"}`.
    parameters   TEXT NOT NULL,
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
