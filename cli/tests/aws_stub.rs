//! The cold-start bench's HTTPS stub (`sasctl::aws_stub`) answers the AWS SDK as AWS would:
//! over TLS, trusting only the stub's own root, the calls the functions' first events make
//! succeed, and the stub records each one and each handshake.

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use aws_smithy_http_client::tls::{Provider, TlsContext, TrustStore, rustls_provider::CryptoMode};
use sas::adapters::aws::{Clients, DynamoStore, SqsQueues, TableNames};
use sas::domain::{OrderId, Timestamp};
use sas::ports::{Outgoing, QueueUrl, Queues, StateStore};
use sasctl::aws_stub::AwsStub;

/// SDK clients pointed at the stub, trusting only `trust`.
async fn clients_trusting(stub: &AwsStub, trust: TrustStore) -> Clients {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .tls_context(TlsContext::builder().with_trust_store(trust).build().unwrap())
        .build_https();
    let sdk = sas::adapters::aws::config_loader()
        .http_client(http)
        .endpoint_url(stub.endpoint())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new("t", "t", None, None, "test"))
        .load()
        .await;
    Clients::new(&sdk)
}

async fn clients(stub: &AwsStub) -> Clients {
    clients_trusting(stub, TrustStore::empty().with_pem_certificate(stub.root_pem.as_bytes())).await
}

#[tokio::test]
async fn sdk_calls_succeed_over_tls_and_are_recorded() {
    let stub = AwsStub::start(&std::env::temp_dir()).await.unwrap();
    assert!(stub.roots_file.exists());
    assert!(stub.roots >= 1);
    let clients = clients(&stub).await;
    let tables = TableNames::new("bench-state");
    let store = DynamoStore::new(clients.dynamodb.clone(), tables.clone());
    let queues = SqsQueues::new(clients.sqs.clone());

    assert_eq!(store.task(&OrderId::parse("o-1").unwrap()).await.unwrap(), None);
    assert!(store.due(Timestamp(u64::MAX / 2), 10).await.unwrap().is_empty());
    let queue = QueueUrl("https://sqs.us-east-1.amazonaws.com/000000000000/bench-scheduler".into());
    queues.send_batch(&queue, vec![Outgoing::new("a".into()), Outgoing::new("b".into())]).await.unwrap();
    queues.send(&queue, Outgoing::new("c".into())).await.unwrap();
    let item = [("OrderId".to_owned(), AttributeValue::S("o-1".into()))];
    clients
        .dynamodb
        .put_item()
        .table_name("bench-state")
        .set_item(Some(item.clone().into()))
        .send()
        .await
        .unwrap();
    let put = Put::builder().table_name("bench-state").set_item(Some(item.into())).build().unwrap();
    let write = TransactWriteItem::builder().put(put).build();
    clients.dynamodb.transact_write_items().transact_items(write).send().await.unwrap();

    let (calls, handshakes) = stub.take();
    let labels: Vec<&str> = calls.iter().map(|c| c.call.as_str()).collect();
    let due_queries = labels.iter().filter(|l| l.starts_with("dynamodb Query bench-state/")).count();
    assert_eq!(due_queries, tables.due_shards as usize, "{labels:?}");
    for expected in [
        "dynamodb GetItem bench-state",
        "sqs SendMessageBatch bench-scheduler x2",
        "sqs SendMessageBatch bench-scheduler x1",
        "dynamodb PutItem bench-state",
        "dynamodb TransactWriteItems bench-state",
    ] {
        assert!(labels.contains(&expected), "{expected} not in {labels:?}");
    }
    assert!(calls.iter().all(|c| c.status == 200), "{calls:?}");
    assert!(handshakes >= 1);
    assert_eq!(stub.take(), (vec![], 0), "take drains");
}

#[tokio::test]
async fn a_client_without_the_stubs_root_is_refused() {
    let stub = AwsStub::start(&std::env::temp_dir()).await.unwrap();
    let clients = clients_trusting(&stub, TrustStore::empty()).await;
    let store = DynamoStore::new(clients.dynamodb, TableNames::new("s"));
    assert!(store.task(&OrderId::parse("o-1").unwrap()).await.is_err());
    let (calls, handshakes) = stub.take();
    assert_eq!((calls.len(), handshakes), (0, 0));
}
