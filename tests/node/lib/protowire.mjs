// Protocol Buffers' wire format by hand (varints, length-delimited fields), so that tests can
// speak a gRPC API from its published field numbers without sharing kvserve's .proto files:
// what they encode is what the API's definition says, not what kvserve's copy says.
//
//   const buf = msg([[1, str('key')], [3, bool(true)], [2, msg([[1, varint(7)]])]]);
//   const fields = decode(buf);  // Map: field number -> [values] (Buffer or BigInt)

// A field's value: [wireType, payload Buffer].
export const varint = (n) => {
  let v = BigInt(n);
  const out = [];
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v) b |= 0x80;
    out.push(b);
  } while (v);
  return [0, Buffer.from(out)];
};
export const bool = (b) => varint(b ? 1 : 0);
export const bytes = (b) => [2, Buffer.from(b)];
export const str = (s) => bytes(Buffer.from(s, 'utf8'));
export const double = (d) => {
  const b = Buffer.alloc(8);
  b.writeDoubleLE(d);
  return [1, b];
};

// A message from [fieldNumber, value] pairs (a repeated field is several pairs).
export function msg(fields) {
  const parts = [];
  for (const [no, [type, payload]] of fields) {
    parts.push(varint((no << 3) | type)[1]);
    if (type === 2) parts.push(varint(payload.length)[1]);
    parts.push(payload);
  }
  return [2, Buffer.concat(parts)];
}
export const encode = (fields) => msg(fields)[1];

function readVarint(buf, at) {
  let v = 0n, shift = 0n;
  for (;;) {
    if (at >= buf.length) throw new Error('truncated varint');
    const b = buf[at++];
    v |= BigInt(b & 0x7f) << shift;
    if (!(b & 0x80)) return [v, at];
    shift += 7n;
  }
}

// Field number -> list of values: BigInt for varints, Buffer for the rest.
export function decode(buf) {
  const out = new Map();
  let at = 0;
  while (at < buf.length) {
    let key;
    [key, at] = readVarint(buf, at);
    const no = Number(key >> 3n), type = Number(key & 7n);
    let value;
    if (type === 0) {
      [value, at] = readVarint(buf, at);
    } else if (type === 2) {
      let n;
      [n, at] = readVarint(buf, at);
      value = buf.subarray(at, at + Number(n));
      at += Number(n);
    } else if (type === 1 || type === 5) {
      const n = type === 1 ? 8 : 4;
      value = buf.subarray(at, at + n);
      at += n;
    } else {
      throw new Error(`wire type ${type} at field ${no}`);
    }
    if (!out.has(no)) out.set(no, []);
    out.get(no).push(value);
  }
  return out;
}

// The last value of field `no` (proto3: the last one wins), or undefined.
export const field = (m, no) => m.get(no)?.at(-1);

// google.protobuf.Struct / Value (struct.proto: Struct.fields = 1, a map<string, Value> of
// entries key = 1, value = 2; Value: string_value = 3, bool_value = 4, struct_value = 5,
// list_value = 6, whose values = 1).
export function structOf(obj) {
  const value = (v) => {
    if (typeof v === 'string') return msg([[3, str(v)]]);
    if (typeof v === 'boolean') return msg([[4, bool(v)]]);
    if (typeof v === 'number') return msg([[2, double(v)]]);
    if (Array.isArray(v)) return msg([[6, msg(v.map((x) => [1, value(x)]))]]);
    return msg([[5, structOf(v)]]);
  };
  return msg(Object.entries(obj).map(([k, v]) => [1, msg([[1, str(k)], [2, value(v)]])]));
}
export function readStruct(buf) {
  const obj = {};
  for (const entry of decode(buf).get(1) ?? []) {
    const e = decode(entry);
    obj[field(e, 1).toString('utf8')] = readValue(field(e, 2));
  }
  return obj;
}
function readValue(buf) {
  const v = decode(buf);
  if (v.has(3)) return field(v, 3).toString('utf8');
  if (v.has(4)) return field(v, 4) !== 0n;
  if (v.has(2)) return field(v, 2).readDoubleLE();
  if (v.has(5)) return readStruct(field(v, 5));
  if (v.has(6)) return (decode(field(v, 6)).get(1) ?? []).map(readValue);
  return null;
}
