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

use std::fmt::Write as _;

use keel_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use keel_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use keel_proto::etcdserverpb::request_op::Request;
use keel_proto::etcdserverpb::response_op::Response;
use keel_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, ResponseHeader, ResponseOp,
    TxnRequest,
};
use keel_proto::mvccpb::event::EventType;
use keel_proto::mvccpb::{Event, KeyValue};

use super::script::{Args, Result};
use crate::mvcc::WriteTxn;

/// `prefix` as etcdctl computes its range end (`clientv3.GetPrefixRangeEnd`): the last
/// byte below 0xff incremented, what follows it dropped; `"\0"` (to the end) if none.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&b| b < 0xff) {
        Some(i) => [&prefix[..i], &[prefix[i] + 1]].concat(),
        None => vec![0],
    }
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
fn put_request(args: &mut Args) -> Result<PutRequest> {
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
fn range_request(args: &mut Args) -> Result<RangeRequest> {
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
fn delete_request(args: &mut Args) -> Result<DeleteRangeRequest> {
    let (key, range_end) = key_range(args)?;
    Ok(DeleteRangeRequest {
        key,
        range_end,
        prev_kv: args.flag("prev_kv")?,
    })
}

/// `txn [if=COMPARE]... [then=OP]... [else=OP]...`; see the module docs.
fn txn_request(args: &mut Args) -> Result<TxnRequest> {
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

/// The request of a `put`, `range`, `delete` or `txn` command; `None` for another name.
pub fn request(name: &str, args: &mut Args) -> Result<Option<Request>> {
    Ok(Some(match name {
        "put" => Request::RequestPut(put_request(args)?),
        "range" => Request::RequestRange(range_request(args)?),
        "delete" => Request::RequestDeleteRange(delete_request(args)?),
        "txn" => Request::RequestTxn(txn_request(args)?),
        _ => return Ok(None),
    }))
}

/// Runs `req` in the write txn `w`, as apply runs a txn's operations.
pub fn apply(w: &mut WriteTxn<'_>, req: &Request) -> Result<Response> {
    Ok(match req {
        Request::RequestPut(p) => Response::ResponsePut(w.put(p)?),
        Request::RequestRange(r) => Response::ResponseRange(w.range(r)?),
        Request::RequestDeleteRange(d) => Response::ResponseDeleteRange(w.delete_range(d)?),
        Request::RequestTxn(t) => Response::ResponseTxn(w.txn(t)?),
    })
}

/// One txn operation: `put ...`, `range ...`, `delete ...` or a nested `txn ...`.
fn request_op(text: &str) -> Result<RequestOp> {
    let (name, mut args) = Args::parse(text)?;
    let request =
        request(&name, &mut args)?.ok_or_else(|| format!("unknown txn operation {name:?}"))?;
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

/// The header revision of a response.
pub fn header_of(resp: &Response) -> Option<i64> {
    let h = match resp {
        Response::ResponsePut(p) => &p.header,
        Response::ResponseRange(r) => &r.header,
        Response::ResponseDeleteRange(d) => &d.header,
        Response::ResponseTxn(t) => &t.header,
    };
    h.as_ref().map(|h| h.revision)
}

/// One summary line (`put: rev=R`, `range: count=N more=B rev=R`, `delete: deleted=N
/// rev=R`, `txn: succeeded=B rev=R`), then indented the key-values it carries (`prev:` for
/// the replaced or deleted ones) and a txn's responses, nested.
pub fn response(out: &mut String, indent: usize, resp: &Response) {
    let pad = " ".repeat(indent);
    let rev = header_of(resp).map_or("none".into(), |r| r.to_string());
    let (summary, kvs, nested): (String, Vec<(&str, &KeyValue)>, &[ResponseOp]) = match resp {
        Response::ResponsePut(p) => {
            let prev = p.prev_kv.iter().map(|kv| ("prev: ", kv)).collect();
            (format!("put: rev={rev}"), prev, &[])
        }
        Response::ResponseRange(r) => {
            let line = format!("range: count={} more={} rev={rev}", r.count, r.more);
            (line, r.kvs.iter().map(|kv| ("", kv)).collect(), &[])
        }
        Response::ResponseDeleteRange(d) => {
            let prev = d.prev_kvs.iter().map(|kv| ("prev: ", kv)).collect();
            (
                format!("delete: deleted={} rev={rev}", d.deleted),
                prev,
                &[],
            )
        }
        Response::ResponseTxn(t) => {
            let line = format!("txn: succeeded={} rev={rev}", t.succeeded);
            (line, Vec::new(), &t.responses)
        }
    };
    writeln!(out, "{pad}{summary}").unwrap();
    for (label, x) in kvs {
        writeln!(out, "{pad}  {label}{}", kv(x)).unwrap();
    }
    for op in nested {
        match &op.response {
            Some(r) => response(out, indent + 2, r),
            None => writeln!(out, "{pad}  (empty response)").unwrap(),
        }
    }
}
