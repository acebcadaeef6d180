//! The permission cache: for each user, the union of the key ranges their roles may read and
//! the union they may write (etcd `range_perm_cache.go`, `unifiedRangePermissions`).
//!
//! etcd keeps two interval trees per user and asks them "does some interval hold this key"
//! (`Intersects` of a point) or "do the intervals cover this range without a gap"
//! (`Contains`). Here each union is merged up front into sorted, disjoint, non-touching spans
//! ([`IntervalSet`]), so both questions are one binary search: O(log n) in the user's
//! permission count, no allocation.
//!
//! Keys compare as bytes; an end of `"\0"` means "no upper bound" and an empty end means "the
//! key alone" (etcd's `BytesAffineComparable` rules, restated in [`IntervalSet::permits`]).
//!
//! Invariants:
//! - A user has an entry iff the user exists; its spans are exactly the merge of the
//!   permissions of the roles it holds that exist (a role named in `roles` but absent, e.g.
//!   `root` granted without a role, contributes nothing).
//! - The cache is a pure function of the users and roles: [`PermCache::build`] from scratch
//!   and incremental upkeep ([`PermCache::refresh_user`], [`PermCache::refresh_role`]) give
//!   equal caches (asserted by the store's tests and the reload test).

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};

use keel_proto::authpb::{Permission, Role, User, permission::Type as PermType};

use super::model::{Access, has_root_role, is_open_ended};

/// The upper bound of a span: exclusive key, or none (a from-key permission).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    /// Keys strictly below this one.
    Key(Vec<u8>),
    /// Every key. Sorts after every `Key` (derived `Ord` follows variant order).
    Unbounded,
}

impl End {
    /// How this bound compares with the key bound `key`.
    fn cmp_key(&self, key: &[u8]) -> Ordering {
        match self {
            End::Key(k) => k.as_slice().cmp(key),
            End::Unbounded => Ordering::Greater,
        }
    }
}

/// A union of half-open key intervals `[start, end)`, kept as sorted, disjoint spans with a
/// gap between any two (touching intervals are merged, as etcd's `Contains` treats them as
/// contiguous).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IntervalSet {
    spans: Vec<(Vec<u8>, End)>,
}

impl IntervalSet {
    /// The union of `perms`' intervals: a single key `k` (empty `range_end`) is `[k, k\0)`, a
    /// from-key permission (`range_end == "\0"`) is `[k, ∞)`, others `[key, range_end)`.
    /// Permissions etcd never stores (empty key, `range_end <= key`) cover nothing.
    pub fn from_permissions<'a>(perms: impl IntoIterator<Item = &'a Permission>) -> IntervalSet {
        let mut intervals: Vec<(Vec<u8>, End)> = perms
            .into_iter()
            .filter(|p| !p.key.is_empty())
            .filter_map(|p| {
                let end = if p.range_end.is_empty() {
                    let mut next = p.key.clone();
                    next.push(0);
                    End::Key(next)
                } else if is_open_ended(&p.range_end) {
                    End::Unbounded
                } else if p.key < p.range_end {
                    End::Key(p.range_end.clone())
                } else {
                    return None;
                };
                Some((p.key.clone(), end))
            })
            .collect();
        intervals.sort_unstable();
        let mut spans: Vec<(Vec<u8>, End)> = Vec::with_capacity(intervals.len());
        for (start, end) in intervals {
            match spans.last_mut() {
                // Overlapping or touching the previous span: extend it.
                Some((_, last_end)) if last_end.cmp_key(&start) != Ordering::Less => {
                    if end > *last_end {
                        *last_end = end;
                    }
                }
                _ => spans.push((start, end)),
            }
        }
        IntervalSet { spans }
    }

    /// The end of the span holding `key`, if one does.
    fn span_end(&self, key: &[u8]) -> Option<&End> {
        let after = self
            .spans
            .partition_point(|(start, _)| start.as_slice() <= key);
        let (_, end) = self.spans[..after].last()?;
        (end.cmp_key(key) == Ordering::Greater).then_some(end)
    }

    /// Whether the set permits a request on `key` .. `range_end`, with etcd's semantics:
    ///
    /// - empty `range_end`: the single key `key` lies in some interval (`checkKeyPoint`);
    /// - `range_end == "\0"`: `[key, ∞)` is covered (`checkKeyInterval` of an open end);
    /// - `range_end <= key`: an empty range, which etcd's interval tree permits exactly when
    ///   it permits the key `key` alone;
    /// - otherwise `[key, range_end)` is covered without a gap.
    ///
    /// An empty `key` is never permitted (etcd treats `""` as the largest bound, so no
    /// interval holds it).
    pub fn permits(&self, key: &[u8], range_end: &[u8]) -> bool {
        if key.is_empty() {
            return false;
        }
        let Some(end) = self.span_end(key) else {
            return false;
        };
        if range_end.is_empty() {
            return true;
        }
        if is_open_ended(range_end) {
            return *end == End::Unbounded;
        }
        // An empty range (range_end <= key) needs only the key; otherwise the span holding
        // `key` must reach `range_end` (spans are maximal, so no other span can help).
        range_end <= key || end.cmp_key(range_end) != Ordering::Less
    }

    /// True when the set holds no key.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

/// One user's merged permissions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserPerms {
    /// The user holds role `root`: every key, and admin.
    pub root: bool,
    /// Ranges the user's roles may read (READ and READWRITE permissions).
    pub read: IntervalSet,
    /// Ranges the user's roles may write (WRITE and READWRITE permissions).
    pub write: IntervalSet,
}

impl UserPerms {
    /// Merges the permissions of `user`'s roles found in `roles`.
    pub fn build(user: &User, roles: &BTreeMap<String, Role>) -> UserPerms {
        let perms = || {
            user.roles
                .iter()
                .filter_map(|name| roles.get(name))
                .flat_map(|role| role.key_permission.iter())
        };
        let grants = |p: &&Permission, access: Access| {
            let t = PermType::try_from(p.perm_type);
            matches!(
                (t, access),
                (Ok(PermType::Readwrite), _)
                    | (Ok(PermType::Read), Access::Read)
                    | (Ok(PermType::Write), Access::Write)
            )
        };
        UserPerms {
            root: has_root_role(user),
            read: IntervalSet::from_permissions(perms().filter(|p| grants(p, Access::Read))),
            write: IntervalSet::from_permissions(perms().filter(|p| grants(p, Access::Write))),
        }
    }

    /// Whether the user's roles give `access` on `key` .. `range_end` (see
    /// [`IntervalSet::permits`]). Ignores `root`: the caller decides what root means.
    pub fn permits(&self, key: &[u8], range_end: &[u8], access: Access) -> bool {
        match access {
            Access::Read => self.read.permits(key, range_end),
            Access::Write => self.write.permits(key, range_end),
        }
    }
}

/// Every user's merged permissions, by user name (etcd `rangePermCache`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PermCache {
    users: HashMap<String, UserPerms>,
}

impl PermCache {
    /// The cache of `users` and `roles`, built from scratch (load and snapshot install:
    /// etcd #14571 was a member that skipped this).
    pub fn build(users: &BTreeMap<String, User>, roles: &BTreeMap<String, Role>) -> PermCache {
        PermCache {
            users: users
                .iter()
                .map(|(name, user)| (name.clone(), UserPerms::build(user, roles)))
                .collect(),
        }
    }

    /// The merged permissions of `user`; `None` when the user does not exist.
    pub fn user(&self, user: &str) -> Option<&UserPerms> {
        self.users.get(user)
    }

    /// Brings the entry of user `name` up to date after it was added, changed or deleted.
    pub fn refresh_user(
        &mut self,
        name: &str,
        users: &BTreeMap<String, User>,
        roles: &BTreeMap<String, Role>,
    ) {
        match users.get(name) {
            Some(user) => {
                self.users
                    .insert(name.to_string(), UserPerms::build(user, roles));
            }
            None => {
                self.users.remove(name);
            }
        }
    }

    /// Brings up to date every user holding role `role` after the role changed or was
    /// deleted (users that held a deleted role must be refreshed by name: their `roles` no
    /// longer list it).
    pub fn refresh_role(
        &mut self,
        role: &str,
        users: &BTreeMap<String, User>,
        roles: &BTreeMap<String, Role>,
    ) {
        for (name, user) in users {
            if user.roles.iter().any(|r| r == role) {
                self.users
                    .insert(name.clone(), UserPerms::build(user, roles));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn perm(key: &[u8], range_end: &[u8]) -> Permission {
        Permission {
            perm_type: PermType::Readwrite as i32,
            key: key.to_vec(),
            range_end: range_end.to_vec(),
        }
    }

    #[test]
    fn merges_overlapping_and_touching_intervals() {
        let set = IntervalSet::from_permissions(&[
            perm(b"a", b"c"),
            perm(b"c", b"e"),   // touches [a, c)
            perm(b"b", b"d"),   // inside
            perm(b"x", b""),    // the key x alone
            perm(b"x\0", b"y"), // touches [x, x\0)
        ]);
        assert_eq!(
            set.spans,
            vec![
                (b"a".to_vec(), End::Key(b"e".to_vec())),
                (b"x".to_vec(), End::Key(b"y".to_vec())),
            ]
        );
        assert!(set.permits(b"a", b"e"));
        assert!(set.permits(b"x", b"y"));
        assert!(!set.permits(b"a", b"e\0"));
        assert!(!set.permits(b"e", b""));
    }

    #[test]
    fn keys_ranges_from_key_and_everything() {
        let set = IntervalSet::from_permissions(&[perm(b"k", b""), perm(b"p/", b"p0")]);
        assert!(set.permits(b"k", b""), "the granted key");
        assert!(!set.permits(b"k\0", b""), "the next key");
        assert!(!set.permits(b"k", b"l"), "a range past the key");
        assert!(set.permits(b"k", b"k\0"), "the range of the key alone");
        assert!(set.permits(b"p/a", b"p/b"), "a sub-range of the prefix");
        assert!(!set.permits(b"p/", b"\0"), "from-key past the prefix");
        assert!(!set.permits(b"", b""), "the empty key");
        assert!(
            set.permits(b"k", b"a"),
            "an empty range permitted as its key"
        );
        assert!(!set.permits(b"j", b"a"), "an empty range denied as its key");

        let all = IntervalSet::from_permissions(&[perm(b"\0", b"\0")]);
        assert!(all.permits(b"\0", b"\0"), "the whole keyspace");
        assert!(all.permits(b"zzz", b""));
        let from = IntervalSet::from_permissions(&[perm(b"m", b"\0")]);
        assert!(from.permits(b"m", b"\0"));
        assert!(from.permits(b"n", b"\0"));
        assert!(!from.permits(b"l", b"\0"));
        assert!(!from.permits(b"\0", b"\0"));
    }

    /// etcd's algorithm, transcribed over a plain list: `adt.Interval.Compare`, the in-order
    /// `Visit`, `Contains` and `Intersects` of `pkg/adt/interval_tree.go`, with
    /// `BytesAffineComparable` (empty = largest) as the bound type.
    mod etcd_model {
        use std::cmp::Ordering;

        pub fn affine(a: &[u8], b: &[u8]) -> Ordering {
            match (a.is_empty(), b.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => a.cmp(b),
            }
        }

        type Ivl = (Vec<u8>, Vec<u8>);

        /// `ivl.Compare(ivl2)`: 0 when they overlap.
        fn compare(ivl: &Ivl, ivl2: &Ivl) -> i32 {
            let b_begin = affine(&ivl.0, &ivl2.0);
            let b_end = affine(&ivl.0, &ivl2.1);
            let e_begin = affine(&ivl.1, &ivl2.0);
            if b_begin == Ordering::Less && e_begin != Ordering::Greater {
                return -1;
            }
            if b_end != Ordering::Less {
                return 1;
            }
            0
        }

        fn point(key: &[u8]) -> Ivl {
            let mut end = key.to_vec();
            end.push(0);
            (key.to_vec(), end)
        }

        /// `getMergedPerms`: a permission as the interval etcd inserts.
        pub fn perm_interval(key: &[u8], range_end: &[u8]) -> Ivl {
            if range_end.is_empty() {
                point(key)
            } else if range_end == [0] {
                (key.to_vec(), Vec::new())
            } else {
                (key.to_vec(), range_end.to_vec())
            }
        }

        fn visit(tree: &[Ivl], ivl: &Ivl) -> Vec<Ivl> {
            let mut sorted: Vec<Ivl> = tree.to_vec();
            sorted.sort_by(|a, b| affine(&a.0, &b.0));
            sorted
                .into_iter()
                .filter(|n| compare(ivl, n) == 0)
                .collect()
        }

        /// `isRangeOpPermitted` for one user's tree.
        pub fn permitted(tree: &[Ivl], key: &[u8], range_end: &[u8]) -> bool {
            if range_end.is_empty() {
                // Intersects(point)
                let p = point(key);
                return tree.iter().any(|n| compare(&p, n) == 0);
            }
            let end = if range_end == [0] {
                Vec::new()
            } else {
                range_end.to_vec()
            };
            let ivl = (key.to_vec(), end);
            // Contains(ivl)
            let mut min_begin: Option<Vec<u8>> = None;
            let mut max_end: Vec<u8> = Vec::new();
            for n in visit(tree, &ivl) {
                match &min_begin {
                    None => {
                        min_begin = Some(n.0.clone());
                        max_end = n.1.clone();
                    }
                    Some(_) => {
                        if affine(&max_end, &n.0) == Ordering::Less {
                            return false;
                        }
                        if affine(&n.1, &max_end) == Ordering::Greater {
                            max_end = n.1.clone();
                        }
                    }
                }
            }
            match min_begin {
                None => false,
                Some(b) => {
                    affine(&max_end, &ivl.1) != Ordering::Less
                        && affine(&b, &ivl.0) != Ordering::Greater
                }
            }
        }
    }

    /// Short keys over a tiny alphabet, so intervals overlap, touch and nest often.
    fn key() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(
            prop_oneof![Just(0u8), Just(b'a'), Just(b'b'), Just(b'c')],
            0..4,
        )
    }

    /// A permission as etcd would store it (valid range), or a single key, or from-key.
    fn valid_perm() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
        (key(), key(), 0..4u8).prop_filter_map("valid permission", |(k, e, kind)| {
            let e = match kind {
                0 => Vec::new(),
                1 => vec![0],
                _ => e,
            };
            super::super::model::is_valid_permission_range(&k, &e).then_some((k, e))
        })
    }

    /// A request range: any key (even empty), and an empty, open, or arbitrary end.
    fn request() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
        (key(), key(), 0..3u8).prop_map(|(k, e, kind)| match kind {
            0 => (k, Vec::new()),
            1 => (k, vec![0]),
            _ => (k, e),
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn interval_set_decides_like_etcds_interval_tree(
            perms in proptest::collection::vec(valid_perm(), 0..6),
            requests in proptest::collection::vec(request(), 1..12),
        ) {
            let set = IntervalSet::from_permissions(
                &perms.iter().map(|(k, e)| perm(k, e)).collect::<Vec<_>>(),
            );
            let tree: Vec<_> =
                perms.iter().map(|(k, e)| etcd_model::perm_interval(k, e)).collect();
            for (key, range_end) in &requests {
                prop_assert_eq!(
                    set.permits(key, range_end),
                    etcd_model::permitted(&tree, key, range_end),
                    "perms {:?} request {:?}..{:?}", perms, key, range_end
                );
            }
        }
    }

    fn user(name: &str, roles: &[&str]) -> User {
        User {
            name: name.as_bytes().to_vec(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            ..Default::default()
        }
    }

    fn role(name: &str, perms: Vec<(PermType, &[u8], &[u8])>) -> Role {
        Role {
            name: name.as_bytes().to_vec(),
            key_permission: perms
                .into_iter()
                .map(|(t, k, e)| Permission {
                    perm_type: t as i32,
                    key: k.to_vec(),
                    range_end: e.to_vec(),
                })
                .collect(),
        }
    }

    #[test]
    fn user_perms_split_read_and_write_and_skip_missing_roles() {
        let roles: BTreeMap<String, Role> = [
            role("r", vec![(PermType::Read, b"a", b"")]),
            role("w", vec![(PermType::Write, b"b", b"")]),
            role("rw", vec![(PermType::Readwrite, b"c", b"")]),
        ]
        .into_iter()
        .map(|r| (String::from_utf8(r.name.clone()).unwrap(), r))
        .collect();
        let p = UserPerms::build(&user("u", &["gone", "r", "rw", "w"]), &roles);
        assert!(!p.root);
        assert!(p.permits(b"a", b"", Access::Read) && !p.permits(b"a", b"", Access::Write));
        assert!(!p.permits(b"b", b"", Access::Read) && p.permits(b"b", b"", Access::Write));
        assert!(p.permits(b"c", b"", Access::Read) && p.permits(b"c", b"", Access::Write));
        let root = UserPerms::build(&user("root", &["root"]), &roles);
        assert!(root.root && root.read.is_empty() && root.write.is_empty());
    }

    #[test]
    fn incremental_upkeep_equals_a_rebuild() {
        let mut roles: BTreeMap<String, Role> = BTreeMap::new();
        let mut users: BTreeMap<String, User> = BTreeMap::new();
        roles.insert("r".into(), role("r", vec![(PermType::Read, b"a", b"")]));
        users.insert("u".into(), user("u", &["r"]));
        users.insert("v".into(), user("v", &[]));
        let mut cache = PermCache::build(&users, &roles);
        roles.insert("r".into(), role("r", vec![(PermType::Write, b"z", b"\0")]));
        cache.refresh_role("r", &users, &roles);
        assert_eq!(cache, PermCache::build(&users, &roles));
        users.remove("v");
        cache.refresh_user("v", &users, &roles);
        assert_eq!(cache, PermCache::build(&users, &roles));
        assert!(cache.user("v").is_none());
        assert!(
            cache
                .user("u")
                .unwrap()
                .permits(b"zz", b"\0", Access::Write)
        );
    }
}
