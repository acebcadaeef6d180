//! Model tests of QoS rules: encoding round trips over random rule sets, and the matcher
//! against a naive model that reads each rule field by its definition and decides key
//! containment by enumerating keys.

use proptest::prelude::*;

use crate::qos::{
    Match, Matcher, Method, Priority, RangeCost, RequestInfo, Rule, RuleChange, RuleSet, rules,
};

/// Rule keys: short strings over NUL, `a`, `b`.
fn rule_key() -> impl Strategy<Value = String> {
    proptest::collection::vec(prop_oneof![Just('\0'), Just('a'), Just('b')], 1..=2)
        .prop_map(|cs| cs.into_iter().collect())
}

/// Request keys: short byte strings over NUL, `a`, `b`, 0xff (0xff is not UTF-8, so no rule
/// key holds it: the model must still agree).
fn request_key(min: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![Just(0u8), Just(b'a'), Just(b'b'), Just(0xff)],
        min..=3,
    )
}

const METHODS: [Method; 6] = [
    Method::Range,
    Method::RangeStream,
    Method::Put,
    Method::Txn,
    Method::LeaseGrant,
    Method::Watch,
];

fn any_match() -> impl Strategy<Value = Match> {
    let keys = prop_oneof![
        Just((None, None, None)),
        rule_key().prop_map(|p| (Some(p), None, None)),
        rule_key().prop_map(|k| (None, Some(k), None)),
        (rule_key(), rule_key()).prop_map(|(k, e)| (None, Some(k), Some(e))),
        rule_key().prop_map(|k| (None, Some(k), Some("\0".to_string()))),
    ];
    let cost = prop_oneof![
        2 => Just((None, None)),
        1 => (proptest::option::of(0u64..6), proptest::option::of(0u64..20)),
    ];
    (
        proptest::option::of(proptest::sample::subsequence(METHODS.to_vec(), 1..=3)),
        keys,
        proptest::option::of(prop_oneof![Just("alice"), Just("bob")]),
        cost,
    )
        .prop_map(
            |(methods, (key_prefix, key, range_end), user, (keys_over, bytes_over))| {
                let ranged = keys_over.is_some() || bytes_over.is_some();
                Match {
                    // An expensive-read rule may only name reads.
                    methods: methods.map(|ms| match ranged {
                        true => ms
                            .into_iter()
                            .filter(|m| METHODS[..2].contains(m))
                            .collect(),
                        false => ms,
                    }),
                    key_prefix,
                    key,
                    range_end,
                    user: user.map(str::to_string),
                    range_keys_over: keys_over,
                    range_bytes_over: bytes_over,
                }
            },
        )
}

/// Valid rule sets of up to 6 rules (invalid draws, e.g. `range_end <= key`, are dropped).
fn rule_set() -> impl Strategy<Value = RuleSet> {
    let rule = (
        any_match(),
        proptest::option::of(1u32..1000),
        proptest::option::of(1u32..1000),
        proptest::option::of(1u32..100),
        proptest::option::of(prop_oneof![
            Just(Priority::Low),
            Just(Priority::Normal),
            Just(Priority::High)
        ]),
    );
    (proptest::collection::vec(rule, 0..=6), 0u64..1000).prop_filter_map(
        "invalid rule",
        |(rules, version)| {
            let rules = rules
                .into_iter()
                .enumerate()
                .map(
                    |(i, (matches, rate, burst, max_in_flight, priority))| Rule {
                        name: format!("r{i}"),
                        matches,
                        rate: rate.or(Some(1)),
                        burst: burst.filter(|_| rate.is_some()),
                        max_in_flight,
                        priority,
                    },
                )
                .filter(|r| r.clone().validated("rule").is_ok())
                .collect();
            RuleSet::new(version, rules).ok()
        },
    )
}

/// An owned request.
#[derive(Debug, Clone)]
struct Req {
    method: Method,
    key: Vec<u8>,
    range_end: Vec<u8>,
    user: Option<&'static str>,
    range: Option<RangeCost>,
}

impl Req {
    fn info(&self) -> RequestInfo<'_> {
        let mut r = RequestInfo::new(self.method)
            .keys(&self.key, &self.range_end)
            .user(self.user);
        r.range = self.range;
        r
    }
}

fn request() -> impl Strategy<Value = Req> {
    (
        proptest::sample::select(METHODS.to_vec()),
        request_key(0),
        prop_oneof![Just(vec![]), Just(vec![0]), request_key(1)],
        proptest::option::of(prop_oneof![Just("alice"), Just("bob"), Just("carol")]),
        proptest::option::of(
            (0u64..8, 0u64..30).prop_map(|(keys, bytes)| RangeCost { keys, bytes }),
        ),
    )
        .prop_map(|(method, key, range_end, user, range)| Req {
            method,
            key,
            range_end,
            user,
            range,
        })
}

/// Every byte string of length 1 to 3 over the bytes that rule keys, request keys and
/// their interval ends (prefix ends, `key + "\0"`) use. If a request's keys are not all in
/// a rule's key set, a witness is the request's first key or the end of the rule's set,
/// both in this universe, so enumerating it decides containment exactly.
fn universe() -> Vec<Vec<u8>> {
    let alphabet = [0u8, 1, b'a', b'b', b'c', 0xff];
    let mut all: Vec<Vec<u8>> = vec![vec![]];
    let mut last = vec![vec![]];
    for _ in 0..3 {
        last = last
            .iter()
            .flat_map(|p| alphabet.iter().map(move |&b| [p.clone(), vec![b]].concat()))
            .collect();
        all.extend(last.iter().cloned());
    }
    all.retain(|k| !k.is_empty());
    all
}

/// The request's keys by the definition in `RequestInfo`'s doc.
fn in_request(x: &[u8], r: &Req) -> bool {
    let (k, e) = (&r.key[..], &r.range_end[..]);
    if e.is_empty() || (e != b"\0" && e <= k) {
        x == k
    } else if e == b"\0" {
        x >= k
    } else {
        k <= x && x < e
    }
}

/// The rule's keys by the definition in `Match`'s doc.
fn in_rule(x: &[u8], m: &Match) -> bool {
    match (&m.key_prefix, &m.key, &m.range_end) {
        (Some(p), _, _) => x.starts_with(p.as_bytes()),
        (None, Some(k), None) => x == k.as_bytes(),
        (None, Some(k), Some(e)) if e == "\0" => x >= k.as_bytes(),
        (None, Some(k), Some(e)) => k.as_bytes() <= x && x < e.as_bytes(),
        (None, None, _) => true,
    }
}

fn naive_matches(rule: &Rule, r: &Req, universe: &[Vec<u8>]) -> bool {
    let m = &rule.matches;
    let ranged = m.range_keys_over.is_some() || m.range_bytes_over.is_some();
    let method = match &m.methods {
        Some(ms) => ms.contains(&r.method),
        None => !ranged || matches!(r.method, Method::Range | Method::RangeStream),
    };
    let user = m.user.as_deref().is_none_or(|u| r.user == Some(u));
    let cost = !ranged
        || r.range.is_some_and(|c| {
            m.range_keys_over.is_none_or(|n| c.keys > n)
                && m.range_bytes_over.is_none_or(|n| c.bytes > n)
        });
    let has_keys = m.key_prefix.is_some() || m.key.is_some();
    let keys = !has_keys
        || (!r.key.is_empty()
            && universe
                .iter()
                .filter(|x| in_request(x, r))
                .all(|x| in_rule(x, m)));
    method && user && cost && keys
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn encode_decode_round_trips(set in rule_set()) {
        let bytes = set.encode();
        prop_assert_eq!(RuleSet::decode(&bytes).unwrap(), set.clone());
        // The rule file form reads back to the same rules too.
        let file = rules::to_file(set.rules());
        let from_file = RuleSet::from_yaml(&file).unwrap();
        prop_assert_eq!(from_file.rules(), set.rules());
        // And a replace change carrying them, through its own encoding.
        let change = RuleChange::Replace { rules: set.rules().to_vec() };
        let decoded = RuleChange::decode(&change.encode()).unwrap();
        prop_assert_eq!(&decoded, &change);
        let next = RuleSet::empty().apply(&decoded).unwrap();
        prop_assert_eq!(next.rules(), set.rules());
    }

    #[test]
    fn matching_equals_the_naive_model(set in rule_set(), reqs in proptest::collection::vec(request(), 1..20)) {
        let universe = universe();
        let matcher = Matcher::new(set.rules());
        for r in &reqs {
            let want = set.rules().iter().position(|rule| naive_matches(rule, r, &universe));
            prop_assert_eq!(matcher.first_match(&r.info()), want, "{:?}", r);
        }
    }
}
