use super::*;
use serde_json::json;

fn alarm() -> Typed {
    let schema = json!({
        "type": "object",
        "properties": {
            "severity": {"enum": ["low", "medium", "high", "critical"]},
            "stop_line": {"type": "boolean"},
            "reason": {"type": "string"},
            "zone": {"type": "integer", "minimum": 1, "maximum": 40},
            "offset": {"type": "integer", "minimum": -500, "maximum": 500},
            "count": {"type": "integer", "minimum": 0},
            "temperature_c": {"type": ["number", "null"]},
            "tags": {"type": "array", "items": {"type": "string"}}
        }
    });
    Typed::of("alarm", &Shape::JsonSchema(schema)).unwrap()
}

#[test]
fn properties_get_places_in_the_schemas_order_and_types_from_their_bounds() {
    let t = alarm();
    let Layout::Object { fields, text } = &t.layout else {
        panic!("{t:?}")
    };
    let got: Vec<(&str, usize, &RegType)> = fields
        .iter()
        .map(|f| (f.name.as_str(), f.at, &f.ty))
        .collect();
    let sev = RegType::Enum(vec![
        json!("low"),
        json!("medium"),
        json!("high"),
        json!("critical"),
    ]);
    assert_eq!(
        got,
        [
            ("severity", 0, &sev),
            ("stop_line", 1, &RegType::Bool),
            ("zone", 2, &RegType::U16),
            ("offset", 3, &RegType::I16),
            ("count", 4, &RegType::I32),
            ("temperature_c", 6, &RegType::F32),
        ]
    );
    assert_eq!(text, &["reason", "tags"]);
    assert_eq!(t.registers(), 8);
}

#[test]
fn an_answer_fills_its_registers_high_word_first_and_a_missing_value_is_marked() {
    let t = alarm();
    let mut b = [7u16; TYPED_REGS];
    let answer = json!({"severity": "high", "stop_line": true, "reason": "bearing",
        "zone": 12, "offset": -3, "count": 70000, "temperature_c": 81.5});
    t.fill(Some(&answer), &mut b);
    let f = 81.5f32.to_bits();
    assert_eq!(
        b[..8],
        [
            2,
            1,
            12,
            (-3i16) as u16,
            1,
            (70_000u32 - 65_536) as u16,
            (f >> 16) as u16,
            f as u16
        ]
    );
    assert!(b[8..].iter().all(|&r| r == 0), "unused registers read 0");

    // Absent, null, out of the type's range, wrong type: "no value".
    let partial = json!({"severity": "unknown", "zone": 70000, "offset": 1.5,
        "count": -2147483649i64, "temperature_c": null, "stop_line": "yes"});
    t.fill(Some(&partial), &mut b);
    assert_eq!(
        b[..8],
        [0xFFFF, 0xFFFF, 0xFFFF, 0x8000, 0x8000, 0, 0x7FC0, 0]
    );
    // An integer written as 3.0 is the integer 3.
    t.fill(Some(&json!({"zone": 3.0})), &mut b);
    assert_eq!(b[2], 3);
    // No answer (not valid): every property is "no value".
    t.fill(None, &mut b);
    assert_eq!(
        b[..8],
        [0xFFFF, 0xFFFF, 0xFFFF, 0x8000, 0x8000, 0, 0x7FC0, 0]
    );
}

#[test]
fn a_choice_is_its_index_and_other_text_has_none() {
    let t = Typed::of("sev", &Shape::Choice(vec!["low".into(), "high".into()])).unwrap();
    assert_eq!(t.choice_index("low"), 0);
    assert_eq!(t.choice_index("high"), 1);
    assert_eq!(t.choice_index("High"), 0xFFFF);
    assert_eq!(alarm().choice_index("low"), 0xFFFF);
    assert_eq!(t.registers(), 0);
    assert!(t.table(160).contains("    1  high"), "{}", t.table(160));
}

#[test]
fn a_schema_too_wide_for_the_block_is_refused_with_the_count() {
    let props: serde_json::Map<String, Value> = (0..49)
        .map(|i| (format!("p{i}"), json!({"type": "number"})))
        .collect();
    let wide = Shape::JsonSchema(json!({"type": "object", "properties": props}));
    let err = Typed::of("wide", &wide).unwrap_err();
    assert!(err.contains("need 98 registers"), "{err}");
    // 48 floats fill the block exactly.
    let props: serde_json::Map<String, Value> = (0..48)
        .map(|i| (format!("p{i}"), json!({"type": "number"})))
        .collect();
    let full = Shape::JsonSchema(json!({"type": "object", "properties": props}));
    assert_eq!(Typed::of("full", &full).unwrap().registers(), TYPED_REGS);
}

#[test]
fn the_table_names_each_address_type_and_enum_value() {
    let table = alarm().table(160);
    for want in [
        "160       uint16 (enum index)  severity: 0 \"low\", 1 \"medium\", 2 \"high\", 3 \"critical\"",
        "164-165   int32                count",
        "166-167   float32              temperature_c",
        "in the text only: reason, tags",
    ] {
        assert!(table.contains(want), "{want:?} not in\n{table}");
    }
}
