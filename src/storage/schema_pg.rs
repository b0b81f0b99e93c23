// @generated automatically by Diesel CLI.

diesel::table! {
    herald_admin_signouts (session_id) {
        session_id -> Text,
        expires_at -> Timestamptz,
    }
}

diesel::table! {
    herald_attempts (id) {
        id -> Int8,
        message_id -> Int8,
        event_id -> Text,
        attempt_number -> Int4,
        started_at -> Timestamptz,
        finished_at -> Timestamptz,
        duration_ms -> Int8,
        request_fingerprint -> Nullable<Text>,
        response_status -> Nullable<Int4>,
        error_kind -> Nullable<Text>,
        class -> Text,
        retry_after -> Nullable<Text>,
        delay_ms -> Nullable<Int8>,
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
        disabled_at -> Nullable<Timestamptz>,
        disabled_reason -> Nullable<Text>,
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    herald_fanouts (event_id, endpoint) {
        event_id -> Text,
        endpoint -> Text,
        event_type -> Text,
        message_event_id -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    herald_listeners (owner) {
        owner -> Text,
        seen_at -> Timestamptz,
    }
}

diesel::table! {
    herald_ordering_locks (ordering_key, destination) {
        ordering_key -> Text,
        destination -> Text,
        locked_by -> Nullable<Int8>,
    }
}

diesel::table! {
    herald_outbox (id) {
        id -> Int8,
        event_id -> Text,
        channel -> Text,
        destination -> Text,
        payload -> Jsonb,
        state -> Text,
        scheduled_at -> Timestamptz,
        next_attempt_at -> Nullable<Timestamptz>,
        attempts -> Int4,
        max_attempts -> Nullable<Int4>,
        retry_policy -> Text,
        semantics -> Text,
        expires_at -> Nullable<Timestamptz>,
        lease_until -> Nullable<Timestamptz>,
        lease_owner -> Nullable<Text>,
        request_fingerprint -> Nullable<Text>,
        provider_message_id -> Nullable<Text>,
        last_error_class -> Nullable<Text>,
        delivery_status -> Nullable<Text>,
        delivery_status_at -> Nullable<Timestamptz>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        retry_policy_version -> Nullable<Text>,
        state_reason -> Nullable<Text>,
        message_key -> Nullable<Text>,
        enqueued_by -> Nullable<Text>,
        attempt_base -> Int4,
        ordering_key -> Nullable<Text>,
        ordering_seq -> Nullable<Int8>,
        ordering_policy -> Nullable<Text>,
        ordering_released_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    herald_receipt_queue (receipt_id) {
        receipt_id -> Int8,
        due_at -> Timestamptz,
        tries -> Int4,
    }
}

diesel::table! {
    herald_receipts (id) {
        id -> Int8,
        source -> Text,
        provider_event_id -> Text,
        event_type -> Text,
        provider_type -> Text,
        event_time -> Nullable<Timestamptz>,
        received_at -> Timestamptz,
        herald_event_id -> Nullable<Text>,
        provider_message_id -> Nullable<Text>,
        raw -> Jsonb,
        reconciled_at -> Nullable<Timestamptz>,
        replay_key -> Nullable<Text>,
        message_id -> Nullable<Int8>,
        outcome -> Nullable<Text>,
        outcome_reason -> Nullable<Text>,
        match_attempts -> Int4,
        next_match_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    herald_replay_keys (source, replay_key) {
        source -> Text,
        replay_key -> Text,
        provider_event_id -> Text,
        seen_at -> Timestamptz,
    }
}

diesel::table! {
    herald_replays (id) {
        id -> Int8,
        message_id -> Int8,
        event_id -> Text,
        who -> Text,
        reason -> Text,
        from_state -> Text,
        forced -> Bool,
        series_start -> Int4,
        expires_at_before -> Nullable<Timestamptz>,
        expires_at_after -> Nullable<Timestamptz>,
        replayed_at -> Timestamptz,
        provider_message_id_before -> Nullable<Text>,
        ordering_released_at_before -> Nullable<Timestamptz>,
        ended_at_before -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    herald_retry_policies (version) {
        version -> Text,
        name -> Text,
        max_attempts -> Int4,
        parameters -> Text,
        recorded_at -> Timestamptz,
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
        id -> Int8,
        message_id -> Int8,
        who -> Text,
        reason -> Text,
        from_state -> Text,
        skipped_at -> Timestamptz,
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
    herald_listeners,
    herald_ordering_locks,
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
