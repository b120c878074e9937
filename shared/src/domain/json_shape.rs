//! An order's JSON shape, read without building a `serde_json::Value` of it: whether its
//! `items`, when they are an array, hold only objects (`messages.rs`, `OrderRequest::parse`).

use serde::Deserialize;

/// Of an order's JSON object, whether its `items` (the last, if repeated), when they are an
/// array, hold only objects: what `OrderRequest::parse` asks of the shape, read without
/// building a `serde_json::Value` of the whole order.
pub struct ItemsShape {
    pub items_are_objects: bool,
}

impl<'de> Deserialize<'de> for ItemsShape {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ItemsShape, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = ItemsShape;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ItemsShape, A::Error> {
                let mut shape = ItemsShape { items_are_objects: true };
                while let Some(key) = map.next_key::<IsItems>()? {
                    if key.0 {
                        shape.items_are_objects = map.next_value::<AllObjects>()?.0;
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(shape)
            }
        }
        d.deserialize_map(Fields)
    }
}

/// Whether a key is `items` (unescaped as any key).
struct IsItems(bool);

impl<'de> Deserialize<'de> for IsItems {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<IsItems, D::Error> {
        struct Key;
        impl serde::de::Visitor<'_> for Key {
            type Value = IsItems;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<IsItems, E> {
                Ok(IsItems(key == "items"))
            }
        }
        d.deserialize_str(Key)
    }
}

/// Of any JSON value: false only for an array with an element that is not an object.
struct AllObjects(bool);

/// Of any JSON value: whether it is an object.
struct IsObject(bool);

macro_rules! any_other_value {
    ($out:expr) => {
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($out)
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($out)
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($out)
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($out)
        }
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($out)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($out)
        }
    };
}

impl<'de> Deserialize<'de> for AllObjects {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<AllObjects, D::Error> {
        struct Value;
        impl<'de> serde::de::Visitor<'de> for Value {
            type Value = AllObjects;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            any_other_value!(AllObjects(true));
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<AllObjects, A::Error> {
                while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(AllObjects(true))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<AllObjects, A::Error> {
                let mut all = true;
                while let Some(IsObject(object)) = seq.next_element()? {
                    all &= object;
                }
                Ok(AllObjects(all))
            }
        }
        d.deserialize_any(Value)
    }
}

impl<'de> Deserialize<'de> for IsObject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<IsObject, D::Error> {
        struct Value;
        impl<'de> serde::de::Visitor<'de> for Value {
            type Value = IsObject;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            any_other_value!(IsObject(false));
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<IsObject, A::Error> {
                while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(IsObject(true))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<IsObject, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(IsObject(false))
            }
        }
        d.deserialize_any(Value)
    }
}
