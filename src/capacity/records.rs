//! What the capacity model reads of ResourceSlices and ResourceClaims, and nothing more:
//! names, pools, counters, a few device attributes; results and the pods a claim is reserved
//! for. Strings borrow from whatever the records were read from: the API objects of a live
//! cluster or a YAML file ([`SliceRecord::from_api`], [`ClaimRecord::from_api`]), or the bytes
//! of a `kubectl get -o json` list ([`super::fast_json`]), so reading a 200 MB file allocates
//! one vector per device instead of a map per attribute and counter.
//!
//! The field names are the API's (camelCase), so the JSON fast path deserialises straight
//! into these types; unknown fields are skipped unparsed.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::api::resource::v1 as api;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

/// A device attribute the capacity view reads; every other one is skipped unparsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Attr {
    Type,
    Profile,
    ProductName,
    Uuid,
    ParentUuid,
    Minor,
    ParentMinor,
    Index,
    ParentIndex,
}

impl Attr {
    /// The attribute a key names (`<name>` or `<domain>/<name>`), with its domain when
    /// qualified; `None` for attributes the view does not read.
    fn of_key(key: &str) -> Option<(Attr, Option<&str>)> {
        let slash = key.bytes().rposition(|b| b == b'/');
        let bare = slash.map_or(key, |at| &key[at + 1..]);
        let attr = match bare {
            "type" => Attr::Type,
            "profile" => Attr::Profile,
            "productName" => Attr::ProductName,
            "uuid" => Attr::Uuid,
            "parentUUID" => Attr::ParentUuid,
            "minor" => Attr::Minor,
            "parentMinor" => Attr::ParentMinor,
            "index" => Attr::Index,
            "parentIndex" => Attr::ParentIndex,
            _ => return None,
        };
        Some((attr, slash.map(|at| &key[..at])))
    }
}

/// One kept attribute: which, its domain when the key is qualified, and its value.
pub(super) struct AttributeEntry<'a> {
    pub(super) attr: Attr,
    pub(super) domain: Option<&'a str>,
    pub(super) value: AttributeRecord<'a>,
}

/// A JSON object's entries in document order, keys borrowed: cheaper than a map for the
/// handful of counters a device consumes, which are only ever walked.
pub(super) struct Entries<'a, V>(pub(super) Vec<(&'a str, V)>);

impl<V> Default for Entries<'_, V> {
    fn default() -> Self {
        Entries(Vec::new())
    }
}

impl<'de: 'a, 'a, V: Deserialize<'de>> Deserialize<'de> for Entries<'a, V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Vis<'a, V>(PhantomData<(&'a (), V)>);
        impl<'de: 'a, 'a, V: Deserialize<'de>> Visitor<'de> for Vis<'a, V> {
            type Value = Entries<'a, V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Entries::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(key) = map.next_key::<&'de str>()? {
                    entries.push((key, map.next_value()?));
                }
                Ok(Entries(entries))
            }
        }
        d.deserialize_any(Vis(PhantomData))
    }
}

/// A counter's value: a quantity string, parsed by the model (which names the field when it
/// does not parse).
#[derive(Deserialize)]
pub(super) struct Counter<'a> {
    pub(super) value: &'a str,
}

/// `spec.sharedCounters[]`.
#[derive(Deserialize)]
pub(super) struct CounterSetRecord<'a> {
    pub(super) name: &'a str,
    #[serde(borrow)]
    pub(super) counters: Entries<'a, Counter<'a>>,
}

/// `spec.devices[].consumesCounters[]`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ConsumptionRecord<'a> {
    pub(super) counter_set: &'a str,
    #[serde(borrow)]
    pub(super) counters: Entries<'a, Counter<'a>>,
    /// Its compatibility groups (Kubernetes 1.37, KEP-5963); absent on most devices.
    #[serde(borrow, default)]
    pub(super) compatibility_groups: Option<Vec<&'a str>>,
}

/// A device attribute's value, as far as the view reads it (other kinds are `None` in both).
#[derive(Deserialize, Default)]
pub(super) struct AttributeRecord<'a> {
    #[serde(borrow, default)]
    pub(super) string: Option<&'a str>,
    #[serde(default)]
    pub(super) int: Option<i64>,
}

/// The kept attributes of a device; every other one is skipped without being parsed.
#[derive(Default)]
pub(super) struct Attributes<'a>(pub(super) Vec<AttributeEntry<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for Attributes<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Keep<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Keep<'a> {
            type Value = Attributes<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of device attributes")
            }
            fn visit_unit<E>(self) -> Result<Attributes<'a>, E> {
                Ok(Attributes::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Attributes<'a>, A::Error> {
                let mut attributes = Vec::with_capacity(8);
                while let Some(key) = map.next_key::<&'de str>()? {
                    match Attr::of_key(key) {
                        Some((attr, domain)) => attributes.push(AttributeEntry {
                            attr,
                            domain,
                            value: map.next_value()?,
                        }),
                        None => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Attributes(attributes))
            }
        }
        d.deserialize_any(Keep(PhantomData))
    }
}

/// `spec.devices[]`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DeviceRecord<'a> {
    pub(super) name: &'a str,
    #[serde(borrow, default)]
    pub(super) attributes: Attributes<'a>,
    #[serde(borrow, default)]
    pub(super) consumes_counters: Option<Vec<ConsumptionRecord<'a>>>,
}

impl DeviceRecord<'_> {
    /// The attribute as written bare, else qualified with the driver's domain
    /// (`<driver>/<name>`), as the scheduler resolves it.
    pub(super) fn attribute(&self, driver: &str, attr: Attr) -> Option<&AttributeRecord<'_>> {
        let entries = &self.attributes.0;
        entries
            .iter()
            .find(|e| e.attr == attr && e.domain.is_none())
            .or_else(|| {
                entries
                    .iter()
                    .find(|e| e.attr == attr && e.domain == Some(driver))
            })
            .map(|e| &e.value)
    }
}

/// `spec.pool`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PoolRecord<'a> {
    pub(super) name: &'a str,
    pub(super) generation: i64,
    pub(super) resource_slice_count: i64,
}

/// A ResourceSlice's `spec`, as far as the view reads it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SliceSpecRecord<'a> {
    pub(super) driver: &'a str,
    #[serde(borrow, default)]
    pub(super) node_name: Option<&'a str>,
    #[serde(borrow)]
    pub(super) pool: PoolRecord<'a>,
    #[serde(borrow, default)]
    pub(super) devices: Option<Vec<DeviceRecord<'a>>>,
    #[serde(borrow, default)]
    pub(super) shared_counters: Option<Vec<CounterSetRecord<'a>>>,
}

/// A ResourceSlice: its name (for errors) and spec.
pub(super) struct SliceRecord<'a> {
    pub(super) name: &'a str,
    pub(super) spec: SliceSpecRecord<'a>,
}

fn borrowed_counters(
    counters: &std::collections::BTreeMap<String, api::Counter>,
) -> Entries<'_, Counter<'_>> {
    Entries(
        counters
            .iter()
            .map(|(name, counter)| {
                (
                    name.as_str(),
                    Counter {
                        value: counter.value.0.as_str(),
                    },
                )
            })
            .collect(),
    )
}

impl<'a> SliceRecord<'a> {
    /// The record of an API object, borrowing its strings.
    pub(super) fn from_api(slice: &'a api::ResourceSlice) -> Self {
        let spec = &slice.spec;
        let device = |d: &'a api::Device| DeviceRecord {
            name: &d.name,
            attributes: Attributes(
                d.attributes
                    .iter()
                    .flatten()
                    .filter_map(|(key, value)| {
                        let (attr, domain) = Attr::of_key(key)?;
                        Some(AttributeEntry {
                            attr,
                            domain,
                            value: AttributeRecord {
                                string: value.string.as_deref(),
                                int: value.int,
                            },
                        })
                    })
                    .collect(),
            ),
            consumes_counters: d.consumes_counters.as_ref().map(|cs| {
                cs.iter()
                    .map(|c| ConsumptionRecord {
                        counter_set: &c.counter_set,
                        counters: borrowed_counters(&c.counters),
                        compatibility_groups: c
                            .compatibility_groups
                            .as_ref()
                            .map(|g| g.iter().map(String::as_str).collect()),
                    })
                    .collect()
            }),
        };
        SliceRecord {
            name: slice.metadata.name.as_deref().unwrap_or_default(),
            spec: SliceSpecRecord {
                driver: &spec.driver,
                node_name: spec.node_name.as_deref(),
                pool: PoolRecord {
                    name: &spec.pool.name,
                    generation: spec.pool.generation,
                    resource_slice_count: spec.pool.resource_slice_count,
                },
                devices: spec
                    .devices
                    .as_ref()
                    .map(|ds| ds.iter().map(device).collect()),
                shared_counters: spec.shared_counters.as_ref().map(|sets| {
                    sets.iter()
                        .map(|s| CounterSetRecord {
                            name: &s.name,
                            counters: borrowed_counters(&s.counters),
                        })
                        .collect()
                }),
            },
        }
    }
}

/// `status.allocation.devices.results[]`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ResultRecord<'a> {
    pub(super) request: &'a str,
    pub(super) driver: &'a str,
    pub(super) pool: &'a str,
    pub(super) device: &'a str,
    #[serde(default)]
    pub(super) admin_access: Option<bool>,
    #[serde(borrow, default, rename = "shareID")]
    pub(super) share_id: Option<&'a str>,
    #[serde(borrow, default)]
    pub(super) consumed_capacity: Entries<'a, &'a str>,
}

/// `status.reservedFor[]`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ConsumerRecord<'a> {
    #[serde(borrow, default)]
    pub(super) api_group: Option<&'a str>,
    pub(super) resource: &'a str,
    pub(super) name: &'a str,
}

/// An allocated claim: who it is, the pods it is reserved for, and its results.
pub(super) struct ClaimRecord<'a> {
    pub(super) namespace: &'a str,
    pub(super) name: &'a str,
    /// `status.reservedFor` pods by name; other consumers as `<resource>/<name>`.
    pub(super) pods: Vec<Cow<'a, str>>,
    pub(super) results: Vec<ResultRecord<'a>>,
}

/// A consumer as the view names it: a pod by its name, anything else `<resource>/<name>`.
pub(super) fn consumer_name<'a>(
    api_group: Option<&str>,
    resource: &str,
    name: &'a str,
) -> Cow<'a, str> {
    match (api_group, resource) {
        (None | Some(""), "pods") => Cow::Borrowed(name),
        _ => Cow::Owned(format!("{resource}/{name}")),
    }
}

impl<'a> ClaimRecord<'a> {
    /// The record of an API object, borrowing its strings; `None` when it is not allocated.
    pub(super) fn from_api(claim: &'a api::ResourceClaim) -> Option<Self> {
        let status = claim.status.as_ref()?;
        let allocation = status.allocation.as_ref()?;
        let results = allocation
            .devices
            .as_ref()
            .and_then(|d| d.results.as_ref())
            .map(|rs| {
                rs.iter()
                    .map(|r| ResultRecord {
                        request: &r.request,
                        driver: &r.driver,
                        pool: &r.pool,
                        device: &r.device,
                        admin_access: r.admin_access,
                        share_id: r.share_id.as_deref(),
                        consumed_capacity: Entries(
                            r.consumed_capacity
                                .iter()
                                .flatten()
                                .map(|(k, v)| (k.as_str(), v.0.as_str()))
                                .collect(),
                        ),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(ClaimRecord {
            namespace: claim.metadata.namespace.as_deref().unwrap_or_default(),
            name: claim.metadata.name.as_deref().unwrap_or_default(),
            pods: status
                .reserved_for
                .iter()
                .flatten()
                .map(|r| consumer_name(r.api_group.as_deref(), &r.resource, &r.name))
                .collect(),
            results,
        })
    }
}
