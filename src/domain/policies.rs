//! Which retry policy a message comes under, by its destination: the global one, or its
//! endpoint's own (`[endpoints.NAME.retry]`). One table for every place that records or shows
//! it — the API's enqueue, the claim of a row written without one, the message view, the
//! explanation and the admin page — so that none shows the global policy's name or budget for
//! a message its endpoint's policy decides.

use std::collections::BTreeMap;

/// A policy as messages record and show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyId {
    pub name: String,
    /// `NAME@hash` (see `RetryPolicy::version`).
    pub version: String,
    /// Its attempt budget per series, for a message that sets none of its own.
    pub max_attempts: u32,
}

/// The global policy and the endpoints' own, by destination.
#[derive(Debug, Clone, PartialEq)]
pub struct Policies {
    global: PolicyId,
    by_destination: BTreeMap<String, PolicyId>,
    /// `{"endpoint:NAME": [name, version], …}`, as the claim reads it; `None` when no endpoint
    /// has a policy of its own.
    claim_map: Option<serde_json::Value>,
    /// The endpoints' own head-of-line policies, by destination (`endpoint:NAME`).
    orderings: BTreeMap<String, super::OrderingPolicy>,
}

impl Policies {
    /// `endpoints`: (endpoint name, its policy) for each endpoint with a policy of its own.
    pub fn new(global: PolicyId, endpoints: impl IntoIterator<Item = (String, PolicyId)>) -> Self {
        let by_destination: BTreeMap<String, PolicyId> = endpoints
            .into_iter()
            .map(|(name, p)| (super::endpoint_destination(&name), p))
            .collect();
        let claim_map = (!by_destination.is_empty()).then(|| {
            serde_json::Value::Object(
                by_destination
                    .iter()
                    .map(|(d, p)| (d.clone(), serde_json::json!([p.name, p.version])))
                    .collect(),
            )
        });
        Self {
            global,
            by_destination,
            claim_map,
            orderings: BTreeMap::new(),
        }
    }

    /// With the endpoints' own head-of-line policies (`[endpoints.NAME] ordering_policy`), by
    /// endpoint name.
    pub fn with_orderings(
        mut self,
        endpoints: impl IntoIterator<Item = (String, super::OrderingPolicy)>,
    ) -> Self {
        self.orderings = endpoints
            .into_iter()
            .map(|(name, p)| (super::endpoint_destination(&name), p))
            .collect();
        self
    }

    /// The head-of-line policy that applies to a message with key or not (`keyed`), its own
    /// `own` and its `destination`: its own, else its endpoint's, else `block`; `None` unkeyed.
    pub fn ordering_of(
        &self,
        keyed: bool,
        own: Option<super::OrderingPolicy>,
        destination: &str,
    ) -> Option<super::OrderingPolicy> {
        super::OrderingPolicy::effective(keyed, own, self.orderings.get(destination).copied())
    }

    /// The global policy alone.
    pub fn global_only(global: PolicyId) -> Self {
        Self::new(global, [])
    }

    /// The policy a message to `destination` comes under.
    pub fn of(&self, destination: &str) -> &PolicyId {
        self.by_destination.get(destination).unwrap_or(&self.global)
    }

    pub fn global(&self) -> &PolicyId {
        &self.global
    }

    /// What the claim records on a row written without a policy (by SQL, or the library):
    /// `{"endpoint:NAME": [name, version]}` for the endpoints with their own; `None` when no
    /// endpoint has one, so that the claim looks nothing up.
    pub fn claim_map(&self) -> Option<&serde_json::Value> {
        self.claim_map.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str, n: u32) -> PolicyId {
        PolicyId {
            name: name.into(),
            version: format!("{name}@1"),
            max_attempts: n,
        }
    }

    #[test]
    fn an_endpoints_messages_come_under_its_own_policy_and_others_under_the_global() {
        let p = Policies::new(id("default", 15), [("billing".to_owned(), id("bill", 3))]);
        assert_eq!(p.of("endpoint:billing"), &id("bill", 3));
        assert_eq!(p.of("endpoint:other"), &id("default", 15));
        assert_eq!(
            p.of("https://x.example/endpoint:billing"),
            &id("default", 15)
        );
        assert_eq!(
            p.claim_map(),
            Some(&serde_json::json!({"endpoint:billing": ["bill", "bill@1"]}))
        );
        assert_eq!(Policies::global_only(id("default", 15)).claim_map(), None);
    }
}
