// @huggingface/jinja 0.5.x ignores the argument of str.strip / lstrip / rstrip and always
// strips whitespace, while Python (what transformers renders templates with) strips exactly
// the given characters: '  a'.lstrip('\n') keeps its spaces. Qwen3's template relies on the
// Python meaning, so the reference renderer is patched to it here before use.
import { Environment } from '@huggingface/jinja';

const env = new Environment();
env.set('probe', 'x');
const probe = env.lookupVariable('probe');
const proto = Object.getPrototypeOf(probe);
const original = Object.getOwnPropertyDescriptor(proto, 'builtins').get;
const FunctionValue = original.call(probe).get('upper').constructor;
const StringValueClass = probe.constructor;

function pyStrip(s, chars, left, right) {
  if (chars === undefined) {
    if (left) s = s.trimStart();
    if (right) s = s.trimEnd();
    return s;
  }
  const set = new Set([...chars]);
  const cps = [...s];
  let b = 0;
  let e = cps.length;
  if (left) while (b < e && set.has(cps[b])) b++;
  if (right) while (e > b && set.has(cps[e - 1])) e--;
  return cps.slice(b, e).join('');
}

Object.defineProperty(proto, 'builtins', {
  get() {
    const map = original.call(this);
    if (!map.__pyStrip) {
      const self = this;
      const make = (left, right) => new FunctionValue((args) =>
        new StringValueClass(pyStrip(self.value, args?.[0]?.value, left, right)));
      map.set('strip', make(true, true));
      map.set('lstrip', make(true, false));
      map.set('rstrip', make(false, true));
      map.__pyStrip = true;
    }
    return map;
  },
});
