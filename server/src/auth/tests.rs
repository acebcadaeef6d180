//! Data-driven tests of auth: goldenscripts under `testscripts/` run against [`Runner`] (a
//! `script::Commands` of the shared frame, `mvcc/tests_golden/script.rs`), plus the reload
//! test.
//!
//! `testscripts/store/` pins the store's rules (users, roles, grants, enable/disable, the
//! root rules, revision bumps, every error); `testscripts/check/` pins the permission table.
//! Regenerate expected output with `UPDATE_GOLDENFILES=1 cargo test -p keel-server --lib
//! auth::` and review the diff.
//!
//! After every applied command the runner asserts the store's invariants: a failed command
//! changed nothing and staged nothing; a successful one staged exactly the state it holds
//! (loading the sled tree the writes landed in gives an equal store, cache included).
//!
//! Commands (every apply and check command takes `as=USER` (default `root`, empty = no
//! credentials) and `rev=N` (default: the store's revision)):
//!
//! - `enable`, `disable`, `status`
//! - `user-add NAME [password=PW] [no-password=true] [hashed=B64] [plaintext=PW]`
//! - `user-get NAME`, `user-list`, `user-delete NAME`
//! - `user-passwd NAME PW [hashed=B64] [plaintext=PW]`
//! - `grant-role USER ROLE`, `revoke-role USER ROLE`
//! - `role-add NAME`, `role-get NAME`, `role-list`, `role-delete NAME`
//! - `grant-perm ROLE read|write|readwrite|<number>|none KEY [END] [prefix=true]`
//! - `revoke-perm ROLE KEY [END] [prefix=true]`
//! - `authenticate NAME PW`: checks the password, applies Authenticate, prints the token
//! - `token TOKEN`: who the token stands for
//! - `verify NAME PW`: whether PW matches the user's stored hash
//! - `dump`: users, roles and flags
//! - `lease-attach ID KEY...`: attaches keys to a lease, for the checks
//! - `check KIND ...`: KIND is `range|watch KEY [END] [prefix=true]`,
//!   `put KEY [prev-kv=true] [lease=ID]`, `delete KEY [END] [prefix=true] [prev-kv=true]`,
//!   `txn "SPEC"`, `lease-grant`, `lease-revoke ID`, `lease-keepalive ID`,
//!   `lease-ttl ID [keys=true]`, `lease-leases`, `user-get NAME`, `role-get NAME`,
//!   `rpc NAME` (see [`rpc_by_name`]). A txn SPEC is ops separated by spaces, `else`
//!   starting the failure branch: `cmp:R`, `get:R`, `put:KEY[+prev][+lease=ID]`,
//!   `del:R[+prev]`, `txn{ SPEC }`, where R is `KEY`, `KEY..END` or `KEY..*` (from key).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use goldenscript::Argument;
use keel_proto::authpb::{Permission, UserAddOptions};
use keel_proto::etcdserverpb::{
    AuthDisableRequest, AuthEnableRequest, AuthRoleAddRequest, AuthRoleDeleteRequest,
    AuthRoleGetRequest, AuthRoleGrantPermissionRequest, AuthRoleListRequest,
    AuthRoleRevokePermissionRequest, AuthStatusRequest, AuthUserAddRequest,
    AuthUserChangePasswordRequest, AuthUserDeleteRequest, AuthUserGetRequest,
    AuthUserGrantRoleRequest, AuthUserListRequest, AuthUserRevokeRoleRequest, Compare,
    DeleteRangeRequest, LeaseTimeToLiveRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    WatchCreateRequest, request_op,
};
use keel_testkit::grpc::prefix_end;

use super::apply::{self, AuthRequest, AuthResponse, InternalAuthenticate};
use super::check::{self, Rpc};
use super::model::AuthInfo;
use super::perm::PermCache;
use super::store::AuthStore;
use super::token::{SimpleTokens, TokenProvider};
use super::{password, storage};
use crate::backend::{Backend, Batch, schema};
use crate::mvcc::tests_golden::script::{self, Args, Cmd, Result};

test_each_file::test_each_path! { in "server/src/auth/testscripts/store" as store_scripts => run_script }
test_each_file::test_each_path! { in "server/src/auth/testscripts/check" as check_scripts => run_script }

fn run_script(path: &std::path::Path) {
    script::run(path, Runner::new())
}

/// bcrypt cost in tests: the minimum, so scripts stay fast.
const COST: u32 = password::MIN_COST;
/// The random part of every simple token the runner issues (deterministic output).
const PREFIX: &str = "sssvIpwfnLAcWAQH";

struct Runner {
    store: AuthStore,
    tokens: TokenProvider,
    /// The raft index of the next applied command.
    index: u64,
    backend: Backend,
    leases: BTreeMap<i64, Vec<Vec<u8>>>,
}

impl Runner {
    fn new() -> Runner {
        Runner {
            store: AuthStore::new(),
            tokens: TokenProvider::Simple(SimpleTokens::new(Duration::from_secs(300))),
            index: 0,
            backend: Backend::temporary().unwrap(),
            leases: BTreeMap::new(),
        }
    }

    /// The credentials of `as=`/`rev=` (default: root at the current revision).
    fn who(&self, args: &mut Args) -> Result<AuthInfo> {
        let user = args.take("as").unwrap_or_else(|| "root".to_string());
        let rev = match args.take("rev") {
            Some(r) => r.parse()?,
            None => self.store.revision(),
        };
        Ok(if user.is_empty() {
            AuthInfo::default()
        } else {
            AuthInfo::new(user, rev)
        })
    }

    /// Applies one request as `ai`, asserting the invariants (see the module doc).
    fn apply(&mut self, ai: &AuthInfo, req: AuthRequest) -> Result<AuthResponse> {
        let before = self.store.clone();
        let mut writes = Batch::default();
        self.index += 1;
        let result = apply::apply(
            &mut self.store,
            &self.tokens,
            ai,
            self.index,
            &req,
            &mut writes,
        );
        match result {
            Err(e) => {
                assert_eq!(self.store, before, "a failed {req:?} changed the store");
                assert!(writes.is_empty(), "a failed {req:?} staged {writes:?}");
                Err(e.into())
            }
            Ok(resp) => {
                writes.commit(self.backend.tree())?;
                let reloaded = AuthStore::load(self.backend.tree())?;
                assert_eq!(reloaded, self.store, "staged writes differ from the store");
                assert_eq!(
                    self.store.cache(),
                    &PermCache::build(self.store.users(), self.store.roles()),
                    "cache differs from a rebuild"
                );
                Ok(resp)
            }
        }
    }

    /// Runs an apply command, printing the revision change.
    fn apply_command(&mut self, command: &str, args: &mut Args) -> Result<String> {
        let ai = self.who(args)?;
        let name = |args: &mut Args| args.pos("name");
        let req = match command {
            "enable" => AuthRequest::Enable(AuthEnableRequest {}),
            "disable" => AuthRequest::Disable(AuthDisableRequest {}),
            "status" => AuthRequest::Status(AuthStatusRequest {}),
            "user-add" => {
                let name = name(args)?;
                let no_password = args.take("no-password").map(|v| v.parse()).transpose()?;
                let (password, hashed) = passwords(args)?;
                AuthRequest::UserAdd(AuthUserAddRequest {
                    name,
                    password,
                    options: no_password.map(|no_password| UserAddOptions { no_password }),
                    hashed_password: hashed,
                })
            }
            "user-get" => AuthRequest::UserGet(AuthUserGetRequest { name: name(args)? }),
            "user-list" => AuthRequest::UserList(AuthUserListRequest {}),
            "user-delete" => AuthRequest::UserDelete(AuthUserDeleteRequest { name: name(args)? }),
            "user-passwd" => {
                let name = name(args)?;
                let (password, hashed) = match args.next_pos() {
                    Some(pw) => (String::new(), password::hash(&pw, COST)?),
                    None => passwords(args)?,
                };
                AuthRequest::UserChangePassword(AuthUserChangePasswordRequest {
                    name,
                    password,
                    hashed_password: hashed,
                })
            }
            "grant-role" => AuthRequest::UserGrantRole(AuthUserGrantRoleRequest {
                user: name(args)?,
                role: name(args)?,
            }),
            "revoke-role" => AuthRequest::UserRevokeRole(AuthUserRevokeRoleRequest {
                name: name(args)?,
                role: name(args)?,
            }),
            "role-add" => AuthRequest::RoleAdd(AuthRoleAddRequest { name: name(args)? }),
            "role-get" => AuthRequest::RoleGet(AuthRoleGetRequest { role: name(args)? }),
            "role-list" => AuthRequest::RoleList(AuthRoleListRequest {}),
            "role-delete" => AuthRequest::RoleDelete(AuthRoleDeleteRequest { role: name(args)? }),
            "grant-perm" => {
                let role = name(args)?;
                let kind = name(args)?;
                let perm = if kind == "none" {
                    None
                } else {
                    let (key, range_end) = key_range(args)?;
                    let perm_type = match kind.as_str() {
                        "read" => 0,
                        "write" => 1,
                        "readwrite" => 2,
                        n => n.parse()?,
                    };
                    Some(Permission {
                        perm_type,
                        key,
                        range_end,
                    })
                };
                AuthRequest::RoleGrantPermission(AuthRoleGrantPermissionRequest {
                    name: role,
                    perm,
                })
            }
            "revoke-perm" => {
                let role = name(args)?;
                let (key, range_end) = key_range(args)?;
                AuthRequest::RoleRevokePermission(AuthRoleRevokePermissionRequest {
                    role,
                    key,
                    range_end,
                })
            }
            other => return Err(format!("unknown command {other}").into()),
        };
        let revision = self.store.revision();
        let resp = self.apply(&ai, req)?;
        let mut out = match resp {
            AuthResponse::Status(s) => {
                format!("enabled={} revision={}", s.enabled, s.auth_revision)
            }
            AuthResponse::UserGet(u) => format!("roles: {:?}", u.roles),
            AuthResponse::UserList(u) => format!("users: {:?}", u.users),
            AuthResponse::RoleList(r) => format!("roles: {:?}", r.roles),
            AuthResponse::RoleGet(r) => {
                let perms: Vec<String> = r.perm.iter().map(format_perm).collect();
                format!("perms: [{}]", perms.join(", "))
            }
            _ => "ok".to_string(),
        };
        if self.store.revision() != revision {
            write!(out, " (revision {revision} → {})", self.store.revision())?;
        }
        Ok(out + "\n")
    }

    /// `authenticate NAME PW`: etcd's Authenticate (password check outside the store, then
    /// the Authenticate entry).
    fn authenticate(&mut self, args: &mut Args) -> Result<String> {
        let name = args.pos("name")?;
        let pw = args.pos("password")?;
        let check = self.store.password_check(&name)?;
        if !password::verify(&pw, &check.hash) {
            return Err(keel_proto::rpctypes::RpcError::AuthFailed.into());
        }
        let req = AuthRequest::Authenticate(InternalAuthenticate {
            name,
            simple_token: PREFIX.to_string(),
        });
        let AuthResponse::Authenticate(resp) = self.apply(&AuthInfo::default(), req)? else {
            unreachable!()
        };
        assert_eq!(
            check.revision,
            self.store.revision(),
            "no change in between"
        );
        Ok(format!("token {}\n", resp.token))
    }

    /// `verify NAME PW`: whether PW matches the user's stored hash (auth need not be on).
    fn verify(&self, args: &mut Args) -> Result<String> {
        let name = args.pos("name")?;
        let pw = args.pos("password")?;
        let user = self.store.user(&name).ok_or("no such user")?;
        let verdict = if password::verify(&pw, &user.password) {
            "match"
        } else {
            "no match"
        };
        Ok(format!("{verdict}\n"))
    }

    fn token(&self, args: &mut Args) -> Result<String> {
        let token = args.pos("token")?;
        Ok(match self.tokens.lookup(&token, self.store.revision()) {
            Some(ai) => format!("{} at revision {}\n", ai.username, ai.revision),
            None => "invalid\n".to_string(),
        })
    }

    fn dump(&self) -> Result<String> {
        let mut out = format!(
            "enabled={} revision={}\n",
            self.store.is_enabled(),
            self.store.revision()
        );
        for (name, user) in self.store.users() {
            let no_pw = user.options.is_some_and(|o| o.no_password);
            let pw = if no_pw {
                "no-password"
            } else if user.password.is_empty() {
                "empty-password"
            } else {
                "bcrypt"
            };
            writeln!(out, "user {name}: roles={:?} {pw}", user.roles)?;
        }
        for (name, role) in self.store.roles() {
            let perms: Vec<String> = role.key_permission.iter().map(format_perm).collect();
            writeln!(out, "role {name}: [{}]", perms.join(", "))?;
        }
        Ok(out)
    }

    fn lease_attach(&mut self, args: &mut Args) -> Result<String> {
        let id: i64 = args.pos_num("lease ID")?;
        let keys = self.leases.entry(id).or_default();
        while let Some(key) = args.next_pos() {
            keys.push(key.into_bytes());
        }
        Ok(String::new())
    }

    /// `check KIND ...`: prints `<who>: <request> → ok | <error>`.
    fn check(&self, command: &goldenscript::Command, args: &mut Args) -> Result<String> {
        let ai = self.who(args)?;
        let echo: Vec<String> = command
            .args
            .iter()
            .filter(|a| !matches!(a, Argument::KeyValue(k, _) if k == "as" || k == "rev"))
            .map(Argument::to_string)
            .collect();
        let kind = args.pos("check kind")?;
        let leases = |id: i64| self.leases.get(&id).cloned();
        let id = |args: &mut Args| args.pos_num::<i64>("lease ID");
        let s = &self.store;
        let result = match kind.as_str() {
            "range" => {
                let (key, range_end) = key_range(args)?;
                check::range(
                    s,
                    &ai,
                    &RangeRequest {
                        key,
                        range_end,
                        ..Default::default()
                    },
                )
            }
            "watch" => {
                let (key, range_end) = key_range(args)?;
                let r = WatchCreateRequest {
                    key,
                    range_end,
                    ..Default::default()
                };
                check::watch_create(s, &ai, &r)
            }
            "put" => {
                let key = args.pos("key")?.into_bytes();
                let prev_kv = args.flag("prev-kv")?;
                let lease = args.num("lease", 0)?;
                check::put(
                    s,
                    &ai,
                    &PutRequest {
                        key,
                        prev_kv,
                        lease,
                        ..Default::default()
                    },
                    &leases,
                )
            }
            "delete" => {
                let prev_kv = args.flag("prev-kv")?;
                let (key, range_end) = key_range(args)?;
                let r = DeleteRangeRequest {
                    key,
                    range_end,
                    prev_kv,
                };
                check::delete_range(s, &ai, &r)
            }
            "txn" => {
                let spec = args.pos("txn spec")?;
                let txn = parse_txn(&spec)?;
                check::txn(s, &ai, &txn, &leases)
            }
            "lease-grant" => check::lease_grant(s, &ai),
            "lease-revoke" => check::lease_revoke(s, &ai, id(args)?, &leases),
            "lease-keepalive" => check::lease_keep_alive(s, &ai, id(args)?, &leases),
            "lease-ttl" => {
                let id = id(args)?;
                let keys = args.flag("keys")?;
                let r = LeaseTimeToLiveRequest { id, keys };
                check::lease_time_to_live(s, &ai, &r, &leases)
            }
            "lease-leases" => check::lease_leases(s, &ai, self.leases.values().flatten()),
            "user-get" => {
                let name = args.pos("name")?;
                check::user_get(s, &ai, &AuthUserGetRequest { name })
            }
            "role-get" => {
                let role = args.pos("role")?;
                check::role_get(s, &ai, &AuthRoleGetRequest { role })
            }
            "rpc" => {
                let name = args.pos("rpc")?;
                check::rpc(
                    s,
                    &ai,
                    rpc_by_name(&name).ok_or(format!("unknown rpc {name}"))?,
                )
            }
            other => return Err(format!("unknown check {other}").into()),
        };
        let who = if ai.is_anonymous() {
            "(no credentials)".to_string()
        } else if ai.revision != s.revision() {
            format!("{}@{}", ai.username, ai.revision)
        } else {
            ai.username.clone()
        };
        let verdict = match result {
            Ok(()) => "ok".to_string(),
            Err(e) => e.to_string(),
        };
        Ok(format!("{who}: {} → {verdict}\n", echo.join(" ")))
    }
}

impl script::Commands for Runner {
    fn command(&mut self, cmd: &mut Cmd<'_>) -> Result<()> {
        let args = &mut cmd.args;
        cmd.out = match cmd.name {
            "authenticate" => self.authenticate(args)?,
            "token" => self.token(args)?,
            "verify" => self.verify(args)?,
            "dump" => self.dump()?,
            "lease-attach" => self.lease_attach(args)?,
            "check" => self.check(cmd.command, args)?,
            name => self.apply_command(name, args)?,
        };
        Ok(())
    }
}

/// `password=PW` (hashed by the runner, as the API layer does), `hashed=B64` (raw) and
/// `plaintext=PW` (a plaintext password left in the entry). No option: an empty password
/// hashed, as etcd's API hashes it.
fn passwords(args: &mut Args) -> Result<(String, String)> {
    let plaintext = args.take("plaintext").unwrap_or_default();
    let hashed = match (args.take("hashed"), args.take("password")) {
        (Some(h), _) => h,
        (None, Some(pw)) => password::hash(&pw, COST)?,
        (None, None) if plaintext.is_empty() => password::hash("", COST)?,
        (None, None) => String::new(),
    };
    Ok((plaintext, hashed))
}

/// `KEY [END] [prefix=true]` → key and range end (`prefix=true`: etcd's prefix end).
fn key_range(args: &mut Args) -> Result<(Vec<u8>, Vec<u8>)> {
    let prefix = args.flag("prefix")?;
    let key = args.pos("key")?.into_bytes();
    let end = match args.next_pos() {
        Some(end) => end.into_bytes(),
        None if prefix => prefix_end(&key),
        None => Vec::new(),
    };
    Ok((key, end))
}

/// `KEY`, `KEY..END` or `KEY..*` → key and range end.
fn spec_range(s: &str) -> (Vec<u8>, Vec<u8>) {
    match s.split_once("..") {
        None => (s.as_bytes().to_vec(), Vec::new()),
        Some((k, "*")) => (k.as_bytes().to_vec(), vec![0]),
        Some((k, e)) => (k.as_bytes().to_vec(), e.as_bytes().to_vec()),
    }
}

/// Parses a txn SPEC (see the module doc).
fn parse_txn(spec: &str) -> Result<TxnRequest> {
    let spaced = spec.replace('{', "{ ").replace('}', " }");
    let mut tokens = spaced.split_whitespace();
    let txn = parse_ops(&mut tokens)?;
    if let Some(t) = tokens.next() {
        return Err(format!("unexpected {t} in txn spec").into());
    }
    Ok(txn)
}

fn parse_ops<'a>(tokens: &mut impl Iterator<Item = &'a str>) -> Result<TxnRequest> {
    let mut txn = TxnRequest::default();
    let mut failure = false;
    while let Some(token) = tokens.next() {
        if token == "}" {
            break;
        }
        if token == "else" {
            failure = true;
            continue;
        }
        let op = if token == "txn{" {
            request_op::Request::RequestTxn(parse_ops(tokens)?)
        } else {
            let (kind, rest) = token.split_once(':').ok_or(format!("bad op {token}"))?;
            let mut parts = rest.split('+');
            let (key, range_end) = spec_range(parts.next().unwrap_or(""));
            let mut prev_kv = false;
            let mut lease = 0;
            for part in parts {
                match part.split_once('=') {
                    None if part == "prev" => prev_kv = true,
                    Some(("lease", id)) => lease = id.parse()?,
                    _ => return Err(format!("bad op option {part}").into()),
                }
            }
            match kind {
                "cmp" => {
                    txn.compare.push(Compare {
                        key,
                        range_end,
                        ..Default::default()
                    });
                    continue;
                }
                "get" => request_op::Request::RequestRange(RangeRequest {
                    key,
                    range_end,
                    ..Default::default()
                }),
                "put" => request_op::Request::RequestPut(PutRequest {
                    key,
                    prev_kv,
                    lease,
                    ..Default::default()
                }),
                "del" => request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                    key,
                    range_end,
                    prev_kv,
                }),
                _ => return Err(format!("bad op {token}").into()),
            }
        };
        let op = RequestOp { request: Some(op) };
        if failure {
            txn.failure.push(op);
        } else {
            txn.success.push(op);
        }
    }
    Ok(txn)
}

/// The `rpc NAME` names.
fn rpc_by_name(name: &str) -> Option<Rpc> {
    use Rpc::*;
    Some(match name {
        "compact" => Compact,
        "member-add" => MemberAdd,
        "member-remove" => MemberRemove,
        "member-update" => MemberUpdate,
        "member-promote" => MemberPromote,
        "member-list" => MemberList,
        "status" => Status,
        "alarm-get" => AlarmGet,
        "alarm-change" => AlarmChange,
        "defragment" => Defragment,
        "snapshot" => Snapshot,
        "hash" => Hash,
        "hash-kv" => HashKv,
        "move-leader" => MoveLeader,
        "downgrade" => Downgrade,
        "auth-enable" => AuthEnable,
        "auth-disable" => AuthDisable,
        "auth-status" => AuthStatus,
        "user-add" => UserAdd,
        "user-delete" => UserDelete,
        "user-passwd" => UserChangePassword,
        "grant-role" => UserGrantRole,
        "revoke-role" => UserRevokeRole,
        "user-list" => UserList,
        "role-add" => RoleAdd,
        "role-delete" => RoleDelete,
        "grant-perm" => RoleGrantPermission,
        "revoke-perm" => RoleRevokePermission,
        "role-list" => RoleList,
        "authenticate" => Authenticate,
        "lease-grant" => LeaseGrant,
        _ => return None,
    })
}

/// `READ "k"`, `WRITE ["a", "b")`, `READWRITE ["a", ∞)`.
fn format_perm(p: &Permission) -> String {
    let kind = match p.perm_type {
        0 => "READ".to_string(),
        1 => "WRITE".to_string(),
        2 => "READWRITE".to_string(),
        n => format!("TYPE{n}"),
    };
    let q = |b: &[u8]| format!("\"{}\"", b.escape_ascii());
    if p.range_end.is_empty() {
        format!("{kind} {}", q(&p.key))
    } else if p.range_end == [0] {
        format!("{kind} [{}, ∞)", q(&p.key))
    } else {
        format!("{kind} [{}, {})", q(&p.key), q(&p.range_end))
    }
}

/// Applies a history to a store, writes it to a sled tree, and loads it back from the tree
/// and from the tree's key-value pairs (a snapshot's records): same state, same cache, and
/// the permission answers agree.
#[test]
fn reload_from_sled_and_from_snapshot_pairs_gives_the_same_store() {
    let mut r = Runner::new();
    let script = [
        "user-add root password=rootpw",
        "role-add root",
        "grant-role root root",
        "user-add alice password=a",
        "user-add bob no-password=true",
        "role-add reader",
        "role-add writer",
        "grant-perm reader read foo/ prefix=true",
        "grant-perm writer readwrite bar",
        "grant-role alice reader",
        "grant-role alice writer",
        "grant-role bob reader",
        "role-delete writer",
        "enable",
    ];
    let input = script.join("\n") + "\n---\n";
    let output = script::generate(&mut r, &input).unwrap();
    assert!(!output.contains("Error"), "{output}");
    let from_tree = AuthStore::load(r.backend.tree()).unwrap();
    let pairs: Vec<(sled::IVec, sled::IVec)> = r
        .backend
        .tree()
        .iter()
        .collect::<std::result::Result<_, _>>()
        .unwrap();
    // A snapshot holds other components' records too: they must be skipped.
    let mut snapshot: Vec<(Vec<u8>, Vec<u8>)> = pairs
        .iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect();
    snapshot.push((schema::CONSISTENT_INDEX.to_vec(), vec![7; 12]));
    snapshot.push((b"k\0\0\0\0\0\0\0\x02".to_vec(), vec![1]));
    let from_snapshot = AuthStore::load_pairs(snapshot).unwrap();
    assert_eq!(from_tree, r.store);
    assert_eq!(from_snapshot, r.store);
    assert!(from_snapshot.is_enabled());
    assert_eq!(from_snapshot.revision(), r.store.revision());
    assert_eq!(
        from_snapshot.revision(),
        14,
        "13 changes after the starting revision 1"
    );
    // The rebuilt cache answers like the live one.
    let alice = AuthInfo::new("alice", from_snapshot.revision());
    for (key, end, ok) in [
        (&b"foo/x"[..], &b""[..], true),
        (b"foo/", b"foo0", true),
        (b"bar", b"", false), // writer was deleted
        (b"baz", b"", false),
    ] {
        let req = RangeRequest {
            key: key.to_vec(),
            range_end: end.to_vec(),
            ..Default::default()
        };
        assert_eq!(
            check::range(&from_snapshot, &alice, &req).is_ok(),
            ok,
            "{key:?}"
        );
        assert_eq!(check::range(&r.store, &alice, &req).is_ok(), ok, "{key:?}");
    }
    assert!(
        storage::read_tree(r.backend.tree())
            .unwrap()
            .users
            .contains_key("bob")
    );
}

/// A store loaded enabled makes the token provider record tokens; one loaded disabled (e.g.
/// a snapshot taken after AuthDisable) drops the tokens it held.
#[test]
fn tokens_follow_the_loaded_store() {
    let mut r = Runner::new();
    let script = "user-add root password=rootpw\ngrant-role root root\nenable\n---\n";
    script::generate(&mut r, script).unwrap();
    let enabled = AuthStore::load(r.backend.tree()).unwrap();
    let tokens = TokenProvider::Simple(SimpleTokens::new(Duration::from_secs(300)));
    apply::sync_tokens(&enabled, &tokens);
    let token = tokens.assign(&AuthInfo::new("root", 4), PREFIX, 9).unwrap();
    assert_eq!(tokens.lookup(&token, 4), Some(AuthInfo::new("root", 4)));
    apply::sync_tokens(&AuthStore::new(), &tokens);
    assert_eq!(tokens.lookup(&token, 4), None);
    let token = tokens
        .assign(&AuthInfo::new("root", 4), PREFIX, 10)
        .unwrap();
    assert_eq!(
        tokens.lookup(&token, 4),
        None,
        "nothing is recorded while disabled"
    );
}
