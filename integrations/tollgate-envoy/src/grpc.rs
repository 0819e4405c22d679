//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC (tonic), with
//! upstream's health service: what Envoy's `rate_limit_service` cluster calls.
//!
//! Errors are answered as upstream's Go server answers them: status `UNKNOWN` with upstream's
//! message (`rate limit domain must not be empty`, ...).

use std::future::Future;
use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code as PbCode, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Duration as PbDuration, ListValue, Struct, Value as PbValue};
use tokio::net::TcpListener;

use crate::config::{Metadata, Unit};
use crate::service::{Code, Limits, Request, RequestDescriptor, RequestError, Response};

/// The service: the live [`Limits`], replaceable at runtime ([`Service::replace`]).
#[derive(Clone, Debug)]
pub struct Service {
    limits: Arc<ArcSwap<Limits>>,
}

impl Service {
    /// A service deciding with `limits`.
    pub fn new(limits: Limits) -> Service {
        Service { limits: Arc::new(ArcSwap::from_pointee(limits)) }
    }

    /// The limits decisions use now.
    pub fn limits(&self) -> Arc<Limits> {
        self.limits.load_full()
    }

    /// Decisions from now on use `limits` (a reload: see [`Limits::reloaded`]).
    pub fn replace(&self, limits: Limits) {
        self.limits.store(Arc::new(limits));
    }

    /// The gRPC service, for a tonic server of the caller's.
    pub fn grpc(&self) -> RateLimitServiceServer<Service> {
        RateLimitServiceServer::new(self.clone())
    }

    /// Serves `ShouldRateLimit` and `grpc.health.v1.Health` (service `ratelimit` and `""`
    /// serving) on `listener` until `shutdown` completes, then finishes the calls in flight.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_service_status("ratelimit", tonic_health::ServingStatus::Serving).await;
        // TCP_NODELAY on every connection: without it a small response waits for the
        // client's delayed ACK (40 ms on Linux) whenever the previous one is unacknowledged.
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(self.grpc())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }
}

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let request = from_proto(request.into_inner());
        let limits = self.limits.load();
        match limits.should_rate_limit_async(&request).await {
            Ok(response) => Ok(tonic::Response::new(to_proto(&response))),
            Err(e @ RequestError::Unavailable(_)) => Err(tonic::Status::unavailable(e.to_string())),
            Err(e) => Err(tonic::Status::unknown(e.to_string())),
        }
    }
}

/// A request's messages in the service's terms.
pub(crate) fn from_proto(r: RateLimitRequest) -> Request {
    Request {
        domain: r.domain,
        descriptors: r.descriptors.into_iter().map(descriptor).collect(),
        hits_addend: r.hits_addend,
    }
}

fn descriptor(d: RateLimitDescriptor) -> RequestDescriptor {
    RequestDescriptor {
        entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
        limit: d.limit.map(|l| (l.requests_per_unit, override_unit(l.unit))),
        hits_addend: d.hits_addend.map(|h| h.value),
    }
}

/// `envoy.type.v3.RateLimitUnit`'s WEEK, newer than the protos `envoy-types` ships: taken by
/// its number, as upstream takes it.
pub(crate) const WEEK: i32 = 7;

/// An override's unit (`envoy.type.v3.RateLimitUnit`), `None` for UNKNOWN or a number it
/// does not have ([`WEEK`] included).
pub(crate) fn override_unit(unit: i32) -> Option<Unit> {
    if unit == WEEK {
        return Some(Unit::Week);
    }
    match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Second => Some(Unit::Second),
        RateLimitUnit::Minute => Some(Unit::Minute),
        RateLimitUnit::Hour => Some(Unit::Hour),
        RateLimitUnit::Day => Some(Unit::Day),
        RateLimitUnit::Month => Some(Unit::Month),
        RateLimitUnit::Year => Some(Unit::Year),
        _ => None,
    }
}

fn response_unit(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn code(c: Code) -> i32 {
    match c {
        Code::Ok => PbCode::Ok as i32,
        Code::OverLimit => PbCode::OverLimit as i32,
    }
}

/// A response in the protocol's messages.
pub(crate) fn to_proto(r: &Response) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(r.overall_code),
        statuses: r
            .statuses
            .iter()
            .map(|s| DescriptorStatus {
                code: code(s.code),
                current_limit: s.current_limit.as_ref().map(|l| PbRateLimit {
                    name: l.name.clone(),
                    requests_per_unit: l.requests_per_unit,
                    unit: response_unit(l.unit) as i32,
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.duration_until_reset.map(|d| PbDuration {
                    seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
                quota: None,
            })
            .collect(),
        response_headers_to_add: r
            .headers
            .iter()
            .map(|(key, value)| HeaderValue {
                key: key.clone(),
                value: value.clone(),
                ..HeaderValue::default()
            })
            .collect(),
        dynamic_metadata: r.dynamic_metadata.as_ref().and_then(|m| match pb_value(m).kind {
            Some(Kind::StructValue(s)) => Some(s),
            _ => None,
        }),
        ..RateLimitResponse::default()
    }
}

/// A metadata value as `google.protobuf.Value`.
fn pb_value(m: &Metadata) -> PbValue {
    let kind = match m {
        Metadata::Null => Kind::NullValue(0),
        Metadata::Bool(b) => Kind::BoolValue(*b),
        Metadata::Number(n) => Kind::NumberValue(*n),
        Metadata::String(s) => Kind::StringValue(s.clone()),
        Metadata::List(items) => Kind::ListValue(ListValue { values: items.iter().map(pb_value).collect() }),
        Metadata::Struct(fields) => Kind::StructValue(Struct {
            fields: fields.iter().map(|(k, v)| (k.clone(), pb_value(v))).collect(),
        }),
    };
    PbValue { kind: Some(kind) }
}
