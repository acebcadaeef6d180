//! A client that cancels its calls quickly keeps its connection: the other calls on it go on.
//! h2's rapid-reset guard closed a connection on which 20 streams were reset by the client
//! before the server took them up, at once; etcd has no such limit
//! (`api::MAX_PENDING_ACCEPT_RESET_STREAMS`). Found by a fresh-user check with Python's grpc,
//! whose cancels arrive right behind their requests; sent here with h2 directly, so every
//! request and its reset reach the server in the same few writes.

use keel_proto::etcdserverpb::{PutRequest, RangeRequest, RangeResponse};
use keel_testkit::grpc::{self, runtime};
use prost::Message;
use prost::bytes::Bytes;

use crate::member;

/// A gRPC message frame: uncompressed flag, length (big endian), the message.
fn grpc_frame(msg: &impl Message) -> Bytes {
    let body = msg.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    frame.into()
}

#[test]
fn streams_the_client_resets_before_the_server_takes_them_up_do_not_close_the_connection() {
    let (_guard, keel) = member(&[]);
    runtime().block_on(async {
        let mut kv = grpc::kv(&keel.endpoint()).await;
        kv.put(PutRequest {
            key: b"k".to_vec(),
            value: vec![b'v'; 300],
            ..Default::default()
        })
        .await
        .expect("put");

        let tcp = tokio::net::TcpStream::connect(keel.endpoint())
            .await
            .expect("connect");
        // The client keeps every stream it reset in mind, and has no guard of its own: only
        // the server's may end the connection.
        let (mut client, connection) = h2::client::Builder::new()
            .max_concurrent_reset_streams(4_096)
            .max_local_error_reset_streams(None)
            .handshake(tcp)
            .await
            .expect("handshake");
        let connection = tokio::spawn(connection);
        let uri = format!("http://{}/etcdserverpb.KV/Range", keel.endpoint());
        let request = || {
            http::Request::post(uri.as_str())
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .expect("request")
        };
        let range = grpc_frame(&RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        });
        // 2,000 requests, each reset right after it was sent.
        for _ in 0..2_000 {
            client = client.ready().await.expect("connection still open");
            let (_response, mut stream) = client.send_request(request(), false).expect("send");
            stream.send_data(range.clone(), true).expect("send data");
            stream.send_reset(h2::Reason::CANCEL);
        }
        // The connection still serves: one more range on it is answered in full.
        client = client.ready().await.expect("connection still open");
        let (response, mut stream) = client.send_request(request(), false).expect("send");
        stream.send_data(range, true).expect("send data");
        let response = response.await.expect("the connection was closed");
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let mut bytes = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.expect("data");
            let _ = body.flow_control().release_capacity(chunk.len());
            bytes.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await.expect("trailers").expect("trailers");
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"0"[..])
        );
        let answer = RangeResponse::decode(&bytes[5..]).expect("range response");
        assert_eq!(answer.kvs[0].value, vec![b'v'; 300]);
        assert!(!connection.is_finished(), "the connection ended");
    });
}
