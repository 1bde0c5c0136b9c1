//! `device.attributes` and `device.capacity`: maps from domain to (name → value) that answer
//! a domain the device does not have with an empty map, as Kubernetes' DRA environment does,
//! while `in` still reports only the domains that exist.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};

use cel::ExecutionError;
use cel::common::traits::{self, Container, Indexer, Iterable, Sizer};
use cel::common::types::{CelInt, CelMap, CelMapKey, CelString, MAP_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};

/// The string a field selection or index uses.
pub(super) fn string_key(idx: &dyn Val) -> Result<&str, ExecutionError> {
    idx.downcast_ref::<CelString>()
        .map(|s| s.inner())
        .ok_or_else(|| ExecutionError::UnexpectedType {
            got: idx.get_type().name().to_owned(),
            want: "string".to_owned(),
        })
}

/// `device.attributes` / `device.capacity`: domain → (id → value), answering an unknown
/// domain with an empty map.
#[derive(Clone, Debug)]
pub(super) struct DomainMap {
    /// Sorted by domain.
    domains: Vec<(CelString<'static>, CelMap<'static>)>,
    empty: CelMap<'static>,
}

impl DomainMap {
    pub(super) fn new(
        domains: BTreeMap<String, HashMap<CelMapKey<'static>, Box<dyn Val>>>,
    ) -> Self {
        DomainMap {
            domains: domains
                .into_iter()
                .map(|(domain, ids)| (CelString::from(domain), CelMap::from(ids)))
                .collect(),
            empty: CelMap::from(HashMap::new()),
        }
    }

    fn find(&self, domain: &str) -> Option<&CelMap<'static>> {
        self.domains
            .binary_search_by(|(d, _)| d.inner().cmp(domain))
            .ok()
            .map(|i| &self.domains[i].1)
    }
}

impl Val for DomainMap {
    fn get_type(&self) -> &Type {
        &MAP_TYPE
    }

    fn cel_type() -> &'static Type {
        &MAP_TYPE
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(self)
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_iterable<'b, 'v>(&'b self) -> Option<&'b (dyn Iterable + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(self)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<DomainMap>().is_some_and(|other| {
            self.domains.len() == other.domains.len()
                && self
                    .domains
                    .iter()
                    .zip(&other.domains)
                    .all(|((d1, m1), (d2, m2))| d1.inner() == d2.inner() && m1.equals(m2))
        })
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for DomainMap {}

impl Indexer for DomainMap {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        let domain = string_key(idx)?;
        Ok(CowVal::Borrowed(self.find(domain).unwrap_or(&self.empty)))
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl Container for DomainMap {
    fn contains(&self, value: &dyn Val) -> Result<bool, ExecutionError> {
        Ok(value
            .downcast_ref::<CelString>()
            .is_some_and(|domain| self.find(domain.inner()).is_some()))
    }
}

impl Iterable for DomainMap {
    fn iter<'b, 'v>(&'b self) -> Box<dyn traits::Iterator<'b, 'v> + 'b>
    where
        Self: 'v,
    {
        Box::new(DomainIter(self.domains.iter()))
    }
}

struct DomainIter<'b>(std::slice::Iter<'b, (CelString<'static>, CelMap<'static>)>);

impl<'b, 'v> traits::Iterator<'b, 'v> for DomainIter<'b> {
    fn next(&mut self) -> Option<&'b (dyn Val + 'v)> {
        self.0.next().map(|(domain, _)| domain as &dyn Val)
    }
}

impl Sizer for DomainMap {
    fn size(&self) -> CelInt {
        CelInt::from(self.domains.len() as i64)
    }
}
