// @generated automatically by Diesel CLI.

diesel::table! {
    herald_admin_signouts (session_id) {
        session_id -> Text,
        expires_at -> TimestamptzSqlite,
    }
}

diesel::table! {
    herald_attempts (id) {
        id -> BigInt,
        message_id -> BigInt,
        event_id -> Text,
        attempt_number -> Integer,
        started_at -> TimestamptzSqlite,
        finished_at -> TimestamptzSqlite,
        duration_ms -> BigInt,
        request_fingerprint -> Nullable<Text>,
        response_status -> Nullable<Integer>,
        error_kind -> Nullable<Text>,
        class -> Text,
        retry_after -> Nullable<Text>,
        delay_ms -> Nullable<BigInt>,
        delay_reason -> Nullable<Text>,
        policy_version -> Text,
        provider_message_id -> Nullable<Text>,
        response_excerpt -> Nullable<Text>,
        lease_owner -> Nullable<Text>,
        next_state -> Text,
    }
}

diesel::table! {
    herald_endpoints (name) {
        name -> Text,
        disabled_at -> Nullable<TimestamptzSqlite>,
        disabled_reason -> Nullable<Text>,
        updated_at -> TimestamptzSqlite,
    }
}

diesel::table! {
    herald_fanouts (event_id, endpoint) {
        event_id -> Text,
        endpoint -> Text,
        event_type -> Text,
        message_event_id -> Text,
        created_at -> TimestamptzSqlite,
    }
}

diesel::table! {
    herald_outbox (id) {
        id -> BigInt,
        event_id -> Text,
        channel -> Text,
        destination -> Text,
        payload -> Json,
        state -> Text,
        scheduled_at -> TimestamptzSqlite,
        next_attempt_at -> Nullable<TimestamptzSqlite>,
        attempts -> Integer,
        max_attempts -> Nullable<Integer>,
        retry_policy -> Text,
        semantics -> Text,
        expires_at -> Nullable<TimestamptzSqlite>,
        lease_until -> Nullable<TimestamptzSqlite>,
        lease_owner -> Nullable<Text>,
        request_fingerprint -> Nullable<Text>,
        provider_message_id -> Nullable<Text>,
        last_error_class -> Nullable<Text>,
        delivery_status -> Nullable<Text>,
        delivery_status_at -> Nullable<TimestamptzSqlite>,
        created_at -> TimestamptzSqlite,
        updated_at -> TimestamptzSqlite,
        retry_policy_version -> Nullable<Text>,
        state_reason -> Nullable<Text>,
        message_key -> Nullable<Text>,
        enqueued_by -> Nullable<Text>,
        attempt_base -> Integer,
        ordering_key -> Nullable<Text>,
        ordering_seq -> Nullable<BigInt>,
        ordering_policy -> Nullable<Text>,
        ordering_released_at -> Nullable<TimestamptzSqlite>,
    }
}

diesel::table! {
    herald_receipt_queue (receipt_id) {
        receipt_id -> BigInt,
        due_at -> TimestamptzSqlite,
        tries -> Integer,
    }
}

diesel::table! {
    herald_receipts (id) {
        id -> BigInt,
        source -> Text,
        provider_event_id -> Text,
        event_type -> Text,
        provider_type -> Text,
        event_time -> Nullable<TimestamptzSqlite>,
        received_at -> TimestamptzSqlite,
        herald_event_id -> Nullable<Text>,
        provider_message_id -> Nullable<Text>,
        raw -> Json,
        reconciled_at -> Nullable<TimestamptzSqlite>,
        replay_key -> Nullable<Text>,
        message_id -> Nullable<BigInt>,
        outcome -> Nullable<Text>,
        outcome_reason -> Nullable<Text>,
        match_attempts -> Integer,
        next_match_at -> Nullable<TimestamptzSqlite>,
    }
}

diesel::table! {
    herald_replay_keys (source, replay_key) {
        source -> Text,
        replay_key -> Text,
        provider_event_id -> Text,
        seen_at -> TimestamptzSqlite,
    }
}

diesel::table! {
    herald_replays (id) {
        id -> BigInt,
        message_id -> BigInt,
        event_id -> Text,
        who -> Text,
        reason -> Text,
        from_state -> Text,
        forced -> Bool,
        series_start -> Integer,
        expires_at_before -> Nullable<TimestamptzSqlite>,
        expires_at_after -> Nullable<TimestamptzSqlite>,
        replayed_at -> TimestamptzSqlite,
        provider_message_id_before -> Nullable<Text>,
        ordering_released_at_before -> Nullable<TimestamptzSqlite>,
        ended_at_before -> Nullable<TimestamptzSqlite>,
    }
}

diesel::table! {
    herald_retry_policies (version) {
        version -> Text,
        name -> Text,
        max_attempts -> Integer,
        parameters -> Text,
        recorded_at -> Text,
    }
}

diesel::table! {
    herald_settings (key) {
        key -> Text,
        value -> Text,
    }
}

diesel::table! {
    herald_skips (id) {
        id -> BigInt,
        message_id -> BigInt,
        who -> Text,
        reason -> Text,
        from_state -> Text,
        skipped_at -> TimestamptzSqlite,
    }
}

diesel::table! {
    herald_subscriptions (endpoint, pattern) {
        endpoint -> Text,
        pattern -> Text,
    }
}

diesel::joinable!(herald_replays -> herald_outbox (message_id));
diesel::joinable!(herald_skips -> herald_outbox (message_id));

diesel::allow_tables_to_appear_in_same_query!(
    herald_admin_signouts,
    herald_attempts,
    herald_endpoints,
    herald_fanouts,
    herald_outbox,
    herald_receipt_queue,
    herald_receipts,
    herald_replay_keys,
    herald_replays,
    herald_retry_policies,
    herald_settings,
    herald_skips,
    herald_subscriptions,
);
