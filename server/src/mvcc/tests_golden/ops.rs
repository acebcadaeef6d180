//! The etcd request and response vocabulary of the goldenscript runners (mvcc, lease,
//! watch): parsing `put`/`range`/`delete`/`txn` arguments into the `etcdserverpb` requests,
//! and printing responses and key-values in one format, so every script reads the same.
//!
//! Argument names are the proto field names (`prev_kv=true`, `min_mod_revision=3`, ...).
//! Keys and values are goldenscript strings (`"\0"` is the NUL byte). A `txn` takes its
//! compares and operations as quoted strings in the same syntax, which nest:
//!
//! ```text
//! txn if="x version != 1" then="put r a" else="range x" else="delete x"
//! txn then="txn if='b version = 0' then='put c 1'"
//! ```
//!
//! A compare is `KEY [RANGE_END] TARGET OP VALUE` with TARGET one of `version`, `create`,
//! `mod`, `value`, `lease` and OP one of `=`, `!=`, `<`, `>`.

use std::error::Error;
use std::fmt::Write as _;

use keel_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use keel_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use keel_proto::etcdserverpb::request_op::Request;
use keel_proto::etcdserverpb::response_op::Response;
use keel_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, ResponseHeader, TxnRequest, TxnResponse,
};
use keel_proto::mvccpb::event::EventType;
use keel_proto::mvccpb::{Event, KeyValue};

/// A runner's result.
pub type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// Arguments of one command or one nested operation, consumed by name or position; what
/// is left over is an error (a typo must not be silently ignored).
pub struct Args {
    pos: Vec<String>,
    keys: Vec<(String, String)>,
}

impl Args {
    /// The arguments of a goldenscript command.
    pub fn of(command: &goldenscript::Command) -> Args {
        let mut args = Args {
            pos: Vec::new(),
            keys: Vec::new(),
        };
        for arg in &command.args {
            match arg {
                goldenscript::Argument::Positional(v) => args.pos.push(v.clone()),
                goldenscript::Argument::KeyValue(k, v) => args.keys.push((k.clone(), v.clone())),
                other => args.pos.push(other.to_string()),
            }
        }
        args
    }

    /// Splits a nested operation (`put k v lease=1`) into its name and arguments: tokens
    /// are separated by spaces, `'...'` and `"..."` quote (with `\` escaping the next
    /// character), and `name=value` outside quotes is a key/value argument.
    pub fn parse(text: &str) -> Result<(String, Args)> {
        let mut tokens: Vec<(Option<String>, String)> = Vec::new();
        let mut chars = text.chars().peekable();
        loop {
            while chars.next_if(|c| c.is_whitespace()).is_some() {}
            if chars.peek().is_none() {
                break;
            }
            let (mut key, mut cur, mut quote) = (None, String::new(), None);
            while let Some(c) = chars.next() {
                match (quote, c) {
                    (None, c) if c.is_whitespace() => break,
                    (None, '\'' | '"') => quote = Some(c),
                    (Some(q), c) if c == q => quote = None,
                    (Some(_), '\\') => cur.push(chars.next().ok_or("dangling \\")?),
                    (None, '=')
                        if key.is_none()
                            && !cur.is_empty()
                            && cur.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
                    {
                        key = Some(std::mem::take(&mut cur));
                    }
                    (_, c) => cur.push(c),
                }
            }
            if quote.is_some() {
                return Err(format!("unterminated quote in {text:?}").into());
            }
            tokens.push((key, cur));
        }
        let mut args = Args {
            pos: Vec::new(),
            keys: Vec::new(),
        };
        for (k, v) in tokens {
            match k {
                Some(k) => args.keys.push((k, v)),
                None => args.pos.push(v),
            }
        }
        if args.pos.is_empty() {
            return Err(format!("no operation in {text:?}").into());
        }
        let name = args.pos.remove(0);
        Ok((name, args))
    }

    /// The next positional argument, if any.
    pub fn next_pos(&mut self) -> Option<String> {
        (!self.pos.is_empty()).then(|| self.pos.remove(0))
    }

    /// The next positional argument, or an error naming `what`.
    pub fn pos(&mut self, what: &str) -> Result<String> {
        self.next_pos()
            .ok_or_else(|| format!("missing {what}").into())
    }

    /// The next positional argument parsed as a number.
    pub fn pos_num<T: std::str::FromStr>(&mut self, what: &str) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        let v = self.pos(what)?;
        v.parse().map_err(|e| format!("{what} {v:?}: {e}").into())
    }

    /// The next key/value argument, if any.
    pub fn next_key(&mut self) -> Option<(String, String)> {
        (!self.keys.is_empty()).then(|| self.keys.remove(0))
    }

    /// Removes and returns every value of `key`.
    pub fn take_all(&mut self, key: &str) -> Vec<String> {
        let (taken, kept) = std::mem::take(&mut self.keys)
            .into_iter()
            .partition(|(k, _)| k == key);
        self.keys = kept;
        taken.into_iter().map(|(_, v)| v).collect()
    }

    /// The value of `key` (the last one if repeated).
    pub fn take(&mut self, key: &str) -> Option<String> {
        self.take_all(key).pop()
    }

    /// `key` parsed with `FromStr`, or `default` when absent.
    pub fn num<T: std::str::FromStr>(&mut self, key: &str, default: T) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|e| format!("{key}={v:?}: {e}").into()),
        }
    }

    /// A `key=true|false` flag, false when absent.
    pub fn flag(&mut self, key: &str) -> Result<bool> {
        self.num(key, false)
    }

    /// Fails if any argument was not consumed.
    pub fn done(self) -> Result<()> {
        if self.pos.is_empty() && self.keys.is_empty() {
            return Ok(());
        }
        Err(format!("unexpected arguments: {:?} {:?}", self.pos, self.keys).into())
    }
}

/// `prefix` as etcdctl computes its range end (`clientv3.GetPrefixRangeEnd`).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// `KEY [END] [prefix=true] [from_key=true]`: the key and range end of a request.
pub fn key_range(args: &mut Args) -> Result<(Vec<u8>, Vec<u8>)> {
    let key = args.pos("key")?.into_bytes();
    let mut end = args.next_pos().map(String::into_bytes).unwrap_or_default();
    if args.flag("prefix")? {
        end = prefix_end(&key);
    }
    if args.flag("from_key")? {
        end = vec![0];
    }
    Ok((key, end))
}

/// `put KEY [VALUE] [lease=ID] [prev_kv=true] [ignore_value=true] [ignore_lease=true]
/// [size=N]` (`size` makes the value N bytes of `v`).
pub fn put_request(args: &mut Args) -> Result<PutRequest> {
    let key = args.pos("key")?.into_bytes();
    let mut value = args.next_pos().map(String::into_bytes).unwrap_or_default();
    if let Some(n) = args.take("size") {
        value = vec![b'v'; n.parse()?];
    }
    Ok(PutRequest {
        key,
        value,
        lease: args.num("lease", 0)?,
        prev_kv: args.flag("prev_kv")?,
        ignore_value: args.flag("ignore_value")?,
        ignore_lease: args.flag("ignore_lease")?,
    })
}

/// `range KEY [END] [prefix=true] [from_key=true]` and every `RangeRequest` field by its
/// proto name: `revision`, `limit`, `sort_order` (`none|ascend|descend`), `sort_target`
/// (`key|version|create|mod|value`), `serializable`, `keys_only`, `count_only`,
/// `min_mod_revision`, `max_mod_revision`, `min_create_revision`, `max_create_revision`.
pub fn range_request(args: &mut Args) -> Result<RangeRequest> {
    let (key, range_end) = key_range(args)?;
    let sort_order = match args.take("sort_order").as_deref() {
        None | Some("none") => SortOrder::None,
        Some("ascend") => SortOrder::Ascend,
        Some("descend") => SortOrder::Descend,
        Some(o) => return Err(format!("sort_order {o:?}").into()),
    };
    let sort_target = match args.take("sort_target").as_deref() {
        None | Some("key") => SortTarget::Key,
        Some("version") => SortTarget::Version,
        Some("create") => SortTarget::Create,
        Some("mod") => SortTarget::Mod,
        Some("value") => SortTarget::Value,
        Some(t) => return Err(format!("sort_target {t:?}").into()),
    };
    Ok(RangeRequest {
        key,
        range_end,
        limit: args.num("limit", 0)?,
        revision: args.num("revision", 0)?,
        sort_order: sort_order as i32,
        sort_target: sort_target as i32,
        serializable: args.flag("serializable")?,
        keys_only: args.flag("keys_only")?,
        count_only: args.flag("count_only")?,
        min_mod_revision: args.num("min_mod_revision", 0)?,
        max_mod_revision: args.num("max_mod_revision", 0)?,
        min_create_revision: args.num("min_create_revision", 0)?,
        max_create_revision: args.num("max_create_revision", 0)?,
    })
}

/// `delete KEY [END] [prefix=true] [from_key=true] [prev_kv=true]`.
pub fn delete_request(args: &mut Args) -> Result<DeleteRangeRequest> {
    let (key, range_end) = key_range(args)?;
    Ok(DeleteRangeRequest {
        key,
        range_end,
        prev_kv: args.flag("prev_kv")?,
    })
}

/// `txn [if=COMPARE]... [then=OP]... [else=OP]...`; see the module docs.
pub fn txn_request(args: &mut Args) -> Result<TxnRequest> {
    let ops = |texts: Vec<String>| -> Result<Vec<RequestOp>> {
        texts.iter().map(|t| request_op(t)).collect()
    };
    Ok(TxnRequest {
        compare: args
            .take_all("if")
            .iter()
            .map(|c| compare(c))
            .collect::<Result<_>>()?,
        success: ops(args.take_all("then"))?,
        failure: ops(args.take_all("else"))?,
    })
}

/// One txn operation: `put ...`, `range ...`, `delete ...` or a nested `txn ...`.
fn request_op(text: &str) -> Result<RequestOp> {
    let (name, mut args) = Args::parse(text)?;
    let request = match name.as_str() {
        "put" => Request::RequestPut(put_request(&mut args)?),
        "range" => Request::RequestRange(range_request(&mut args)?),
        "delete" => Request::RequestDeleteRange(delete_request(&mut args)?),
        "txn" => Request::RequestTxn(txn_request(&mut args)?),
        other => return Err(format!("unknown txn operation {other:?}").into()),
    };
    args.done()?;
    Ok(RequestOp {
        request: Some(request),
    })
}

/// `KEY [END] TARGET OP VALUE`.
fn compare(text: &str) -> Result<Compare> {
    let (key, mut args) = Args::parse(text)?;
    let mut rest = Vec::new();
    while let Some(p) = args.next_pos() {
        rest.push(p);
    }
    args.done()?;
    let (range_end, target, op, value) = match rest.as_slice() {
        [t, o, v] => (String::new(), t, o, v),
        [e, t, o, v] => (e.clone(), t, o, v),
        _ => return Err(format!("compare {text:?}: want KEY [END] TARGET OP VALUE").into()),
    };
    let result = match op.as_str() {
        "=" => CompareResult::Equal,
        "!=" => CompareResult::NotEqual,
        "<" => CompareResult::Less,
        ">" => CompareResult::Greater,
        o => return Err(format!("compare op {o:?}").into()),
    };
    let (target, union) = match target.as_str() {
        "version" => (CompareTarget::Version, TargetUnion::Version(value.parse()?)),
        "create" => (
            CompareTarget::Create,
            TargetUnion::CreateRevision(value.parse()?),
        ),
        "mod" => (CompareTarget::Mod, TargetUnion::ModRevision(value.parse()?)),
        "value" => (
            CompareTarget::Value,
            TargetUnion::Value(value.clone().into_bytes()),
        ),
        "lease" => (CompareTarget::Lease, TargetUnion::Lease(value.parse()?)),
        t => return Err(format!("compare target {t:?}").into()),
    };
    Ok(Compare {
        result: result as i32,
        target: target as i32,
        key: key.into_bytes(),
        range_end: range_end.into_bytes(),
        target_union: Some(union),
    })
}

// ------------------------------------------------------------------ printing

/// Bytes as a quoted string; printable ASCII as is, the rest escaped. Values longer than
/// 40 bytes are shown by length.
pub fn quoted(bytes: &[u8]) -> String {
    if bytes.len() > 40 {
        return format!("<{} bytes>", bytes.len());
    }
    format!("\"{}\"", bytes.escape_ascii())
}

/// `"key" = "value" (create=C mod=M ver=V lease=L)`.
pub fn kv(kv: &KeyValue) -> String {
    format!(
        "{} = {} (create={} mod={} ver={} lease={})",
        quoted(&kv.key),
        quoted(&kv.value),
        kv.create_revision,
        kv.mod_revision,
        kv.version,
        kv.lease
    )
}

/// `PUT "key" = ...` or `DELETE "key" ...`, with ` prev: ...` when the event carries it.
pub fn event(e: &Event) -> String {
    let kind = if e.r#type == EventType::Delete as i32 {
        "DELETE"
    } else {
        "PUT"
    };
    let mut line = format!(
        "{kind} {}",
        kv(e.kv.as_ref().unwrap_or(&KeyValue::default()))
    );
    if let Some(prev) = &e.prev_kv {
        write!(line, " prev={}", quoted(&prev.value)).unwrap();
    }
    line
}

/// The header revision, or `none`.
pub fn header(h: &Option<ResponseHeader>) -> String {
    h.as_ref().map_or("none".into(), |h| h.revision.to_string())
}

/// A put response: `put: rev=R` and its `prev_kv`.
pub fn put_response(out: &mut String, indent: usize, r: &PutResponse) {
    let pad = " ".repeat(indent);
    writeln!(out, "{pad}put: rev={}", header(&r.header)).unwrap();
    if let Some(prev) = &r.prev_kv {
        writeln!(out, "{pad}  prev: {}", kv(prev)).unwrap();
    }
}

/// A range response: `range: count=N more=B rev=R` and its key-values.
pub fn range_response(out: &mut String, indent: usize, r: &RangeResponse) {
    let pad = " ".repeat(indent);
    writeln!(
        out,
        "{pad}range: count={} more={} rev={}",
        r.count,
        r.more,
        header(&r.header)
    )
    .unwrap();
    for x in &r.kvs {
        writeln!(out, "{pad}  {}", kv(x)).unwrap();
    }
}

/// A delete response: `delete: deleted=N rev=R` and its `prev_kvs`.
pub fn delete_response(out: &mut String, indent: usize, r: &DeleteRangeResponse) {
    let pad = " ".repeat(indent);
    writeln!(
        out,
        "{pad}delete: deleted={} rev={}",
        r.deleted,
        header(&r.header)
    )
    .unwrap();
    for x in &r.prev_kvs {
        writeln!(out, "{pad}  prev: {}", kv(x)).unwrap();
    }
}

/// A txn response: `txn: succeeded=B rev=R` and each operation's response, nested.
pub fn txn_response(out: &mut String, indent: usize, r: &TxnResponse) {
    let pad = " ".repeat(indent);
    writeln!(
        out,
        "{pad}txn: succeeded={} rev={}",
        r.succeeded,
        header(&r.header)
    )
    .unwrap();
    for op in &r.responses {
        match &op.response {
            Some(Response::ResponsePut(p)) => put_response(out, indent + 2, p),
            Some(Response::ResponseRange(g)) => range_response(out, indent + 2, g),
            Some(Response::ResponseDeleteRange(d)) => delete_response(out, indent + 2, d),
            Some(Response::ResponseTxn(t)) => txn_response(out, indent + 2, t),
            None => writeln!(out, "{pad}  (empty response)").unwrap(),
        }
    }
}
