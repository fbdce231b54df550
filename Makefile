# meshwire build, test and demo. Run as root for test and demo (they create
# network namespaces). See README.md.

export PATH := /usr/local/go/bin:$(PATH)
export CGO_ENABLED := 0

GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
PKG       := github.com/meshwire/meshwire
LDFLAGS   := -s -w -X $(PKG)/internal/buildinfo.Version=$(VERSION) -X $(PKG)/internal/buildinfo.Commit=$(COMMIT)
BIN       := $(CURDIR)/bin

# Install locations: CNI plugins where runtimes look for them, commands on PATH.
DESTDIR   ?=
CNI_BIN_DIR ?= /opt/cni/bin
BINDIR    ?= /usr/local/bin

# Every main package that ships (the test/ tree holds test-only programs;
# internal/ holds development tools such as the docs generator, run by
# `go generate`, never installed).
# (MAINS runs `go list` once, when first needed.)
MAINS     = $(eval MAINS := $$(shell $(GO) list -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' ./...))$(MAINS)
SHIPPED   = $(filter-out $(PKG)/test/% $(PKG)/internal/%,$(MAINS))
TESTBINS  = $(filter $(PKG)/test/%,$(MAINS))
COMMANDS  := meshwire iptables-init

TEST_TIMEOUT ?= 60m
# The node-wide lock of meshwire's kernel tests (internal/kerneltest).
KERNEL_LOCK = /run/meshwire-tests.lock
BENCH ?= .

.PHONY: all build test unit deps demo bench bench-report bench-check bench-fastpath generate install clean fuzz vet image chaos critest cluster cluster-down cluster-smoke cluster-e2e cluster-mesh cluster-ambient cluster-ambient-compare cluster-podstart cluster-podstart-compare cluster-conformance cluster-network-suite cluster-faults cluster-status cluster-runtime-gc cluster-istio-rules cluster-dualstack cluster-istio-podstart cluster-apiserver-away cluster-latency cluster-fastpath-placement

all: build

# host-local first: the bridge and veth plugins carry its Go build ID and run
# it in-process when the host-local on CNI_PATH is that binary.
HOSTLOCAL := $(PKG)/plugins/ipam/host-local

build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ $(HOSTLOCAL)
	$(GO) build -trimpath -ldflags "$(LDFLAGS) -X $(PKG)/internal/hostlocal.BuildID=$$($(GO) tool buildid $(BIN)/host-local)" -o $(BIN)/ $(filter-out $(HOSTLOCAL),$(SHIPPED))
	@test -z "$(TESTBINS)" || $(GO) build -trimpath -o $(BIN)/test/ $(TESTBINS)

# The system packages (apt-get) and the Go modules, fetched at the same time.
deps:
	@test/deps.sh & apt=$$!; $(GO) mod download; st=$$?; wait $$apt && exit $$st

# Kernel tests are the test files built with the "kernel" tag
# (internal/kerneltest), the cluster suites those with the "cluster" tag
# (test/clustersuites): vet checks every build once, and gofmt every file.
# Every go command of build, vet and test compiles with -trimpath, as the
# shipped binaries are built: one compilation of each package in the build
# cache serves them all.
vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet -trimpath ./...
	$(GO) vet -trimpath -tags kernel ./...
	$(GO) vet -trimpath -tags cluster ./test/clustersuites/...

# Every test, kernel tests included (they need root and are never skipped),
# on a host seeded with other tools' rules (test/seed-host.sh), which the
# tests must leave as they found it; the seed goes when they end. The
# kernel tests' lock is held from the seed to its removal (a cluster holds
# it for its life): the test processes serialize on a lock of their own. The
# system packages install while the modules download and build and vet
# compile (the tests wait for them); go test does not vet again what vet
# has checked (-vet=off).
test:
	@mkdir -p $(BIN); test/deps.sh >$(BIN)/deps.log 2>&1 & apt=$$!; \
	  $(MAKE) --no-print-directory build vet; st=$$?; \
	  wait $$apt || st=1; cat $(BIN)/deps.log; exit $$st
	@flock -n $(KERNEL_LOCK) true || echo "make test: waiting for $(KERNEL_LOCK) (a cluster, a benchmark or other tests hold it)"
	@flock $(KERNEL_LOCK) env MESHWIRE_KERNEL_PACKAGE_LOCK=$(KERNEL_LOCK).packages sh -c '\
	  test/seed-host.sh add || exit 1; \
	  MESHWIRE_BIN_DIR=$(BIN) $(GO) test -trimpath -vet=off -tags kernel -count=1 -timeout $(TEST_TIMEOUT) ./...; \
	  st=$$?; test/seed-host.sh remove || st=1; exit $$st'

# Tests that need neither root nor the kernel: any user, no network
# namespace, no firewall tool.
unit:
	$(GO) test -trimpath -count=1 ./...

# The crash tests in full: every command killed at random instants
# CHAOS_KILLS times per plugin command (make test runs a sample of 4).
CHAOS_KILLS ?= 60
# The host is seeded under the kernel tests' lock, as make test seeds it,
# never beside a cluster.
chaos: deps build
	@flock -n $(KERNEL_LOCK) true || echo "make chaos: waiting for $(KERNEL_LOCK) (a cluster, a benchmark or other tests hold it)"
	@flock $(KERNEL_LOCK) env MESHWIRE_KERNEL_PACKAGE_LOCK=$(KERNEL_LOCK).packages MESHWIRE_CHAOS_KILLS=$(CHAOS_KILLS) MESHWIRE_BIN_DIR=$(BIN) sh -c '\
	  test/seed-host.sh add || exit 1; \
	  $(GO) test -tags kernel -count=1 -v -timeout 120m -run "^TestChaos" ./test/e2e/ >$(BIN)/chaos.log 2>&1; \
	  st=$$?; grep -E "kills|^(--- FAIL|ok|FAIL)" $(BIN)/chaos.log; echo "full log: $(BIN)/chaos.log"; \
	  test/seed-host.sh remove || st=1; exit $$st'

# Short coverage-guided fuzzing of every fuzz target (FUZZTIME each).
FUZZTIME ?= 30s
fuzz:
	@for spec in $$($(GO) test -list '^Fuzz' ./... 2>/dev/null | awk '/^ok/{pkg=$$2} /^Fuzz/{print pkg":"$$1}' ); do \
	  pkg=$${spec%%:*}; fn=$${spec##*:}; echo "== $$pkg $$fn"; \
	  $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

# The demo installs the firewall tools its plugins run when missing.
demo: build
	@test/deps.sh demo
	$(BIN)/meshwire demo

# Benchmarks run side by side with the reference plugins v1.9.1 (built by the
# benchmarks from the Go module proxy, once per run) and Debian's 1.1.1
# (/usr/lib/cni, installed by test/deps.sh). What they print goes to
# BENCH_OUT too, between "meshwire-bench:" lines naming the target, the
# commit, whether the tree was clean, the dates, the machine and its load,
# and the node's cached firewall backend (test/bench/run.sh).
BENCH_OUT ?= bench.out
bench: deps build
	@GO=$(GO) MESHWIRE_BIN_DIR=$(BIN) test/bench/run.sh bench $(BENCH_OUT) '$(BENCH)' 120m

# The fast-path subset: BenchmarkFastpath and BenchmarkCapture (EBPF mode),
# each configuration in ROUNDS alternating rounds per placement ("one CPU"
# and "spread", docs/fastpath.md); ROUNDS=2 makes a quick run. Its output
# goes to BENCH_OUT with the same header, for bench-check and bench-report.
ROUNDS ?= 10
bench-fastpath: deps build
	@GO=$(GO) MESHWIRE_BIN_DIR=$(BIN) MESHWIRE_BENCH_ROUNDS=$(ROUNDS) test/bench/run.sh bench-fastpath $(BENCH_OUT) '^Benchmark(Fastpath|Capture)$$' 240m

# Every stated target of the run in BENCH_OUT, judged: the plugins' from
# their tables, the fast path's and EBPF mode's on the paired per-round
# figures of at least MIN_ROUNDS rounds (docs/performance.md#judged); a
# failed benchmark is a miss. Exits 1 on a miss, 2 on output it cannot
# judge.
MIN_ROUNDS ?= 10
bench-check:
	$(GO) run ./test/bench/benchreport -check -min-rounds $(MIN_ROUNDS) -in $(BENCH_OUT)

# The benchmark tables of REPORT_DOCS rewritten from BENCH_OUT between their
# <!-- bench:NAME --> markers (test/bench/benchreport), and BENCH_OUT kept,
# compressed, as docs/bench/COMMIT.txt.gz, which test/bench/benchreport's
# tests check every table against; refuses a dirty tree's or an unfinished
# run's output, and the tables of a benchmark that failed or did not run (a
# make bench-fastpath run: REPORT_DOCS=docs/fastpath.md).
REPORT_DOCS ?= README.md docs/performance.md docs/fastpath.md
bench-report:
	$(GO) run ./test/bench/benchreport -in $(BENCH_OUT) -keep docs/bench $(REPORT_DOCS)

# bpf2go compiles ebpf/capture/capture.c and ebpf/fastpath/fastpath.c;
# clang and libbpf's headers are installed when missing (the generated Go and object are committed: build needs neither).
generate:
	@command -v clang >/dev/null 2>&1 && test -f /usr/include/bpf/bpf_helpers.h || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang llvm libbpf-dev linux-libc-dev >/dev/null; }
	$(GO) generate ./...

# Plugins installed under a second name too, PLUGIN:NAME: the name configs
# written for the reference plugins give as "type" (a copy, executable like
# the first).
PLUGIN_ALIASES := veth:ptp

install: build
	install -d $(DESTDIR)$(CNI_BIN_DIR) $(DESTDIR)$(BINDIR)
	@for f in $(BIN)/*; do \
	  [ -f "$$f" ] || continue; n=$$(basename $$f); \
	  case " $(COMMANDS) " in *" $$n "*) install -m 0755 $$f $(DESTDIR)$(BINDIR)/$$n ;; \
	  *) install -m 0755 $$f $(DESTDIR)$(CNI_BIN_DIR)/$$n ;; esac; \
	done
	@for a in $(PLUGIN_ALIASES); do \
	  install -m 0755 $(BIN)/$${a%%:*} $(DESTDIR)$(CNI_BIN_DIR)/$${a##*:}; \
	done

# The node image (conf/kubernetes/Containerfile), built with podman from a
# root file system made of this machine's Debian packages: no registry.
IMAGE ?= localhost/meshwire
image: build
	@command -v podman >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman >/dev/null; }
	conf/kubernetes/rootfs.sh $(BIN) $(BIN)/image-rootfs
	podman build --quiet -f conf/kubernetes/Containerfile -t $(IMAGE):$(VERSION) -t $(IMAGE):latest $(BIN)/image-rootfs

# A Kubernetes cluster built from source whose network is meshwire
# (test/cluster, docs/kubernetes.md): builds Kubernetes once per pinned
# version into /var/cache/meshwire-cluster, then starts it: NODES=1 (one
# node on the host) or NODES=N (N nodes in namespaces of their own, flannel
# between them). Not part of `make test`. CNI=reference
# (MESHWIRE_CLUSTER_CNI) starts it on the reference plugins v1.9.1 (the
# control); CNI=istio-cni on Istio's istio-cni, chained by Istio's own
# DaemonSet after meshwire's bridge and host-local (test/cluster/lib/istio.sh).
# RUNTIME=containerd2, PROXY_MODE=nftables, FIREWALL=iptables|nftables,
# INSTALL=helm (NODES >= 2: meshwire by helm install of conf/helm/meshwire,
# helm upgrade in cluster-mesh, helm uninstall at cluster-down),
# IP_FAMILY=dual, FROM=COMMIT (the nodes start on meshwire at COMMIT, and
# cluster-mesh's rollout upgrades them to this tree), FORTIO=1 (fortio's
# image on every node, as cluster-latency's clusters have it),
# POD_CGROUPS=1 (kubelet's pod cgroups, one node): the
# cluster's other shapes (test/cluster/cluster.sh's header).
NODES ?= 1
CLUSTER_ENV = MESHWIRE_CLUSTER_NODES=$(NODES) $(if $(CNI),MESHWIRE_CLUSTER_CNI=$(CNI)) $(if $(RUNTIME),MESHWIRE_CLUSTER_RUNTIME=$(RUNTIME)) \
	$(if $(PROXY_MODE),MESHWIRE_CLUSTER_PROXY_MODE=$(PROXY_MODE)) $(if $(FIREWALL),MESHWIRE_CLUSTER_FIREWALL=$(FIREWALL)) \
	$(if $(INSTALL),MESHWIRE_CLUSTER_INSTALL=$(INSTALL)) $(if $(IP_FAMILY),MESHWIRE_CLUSTER_IP_FAMILY=$(IP_FAMILY)) \
	$(if $(FROM),MESHWIRE_CLUSTER_FROM=$(FROM)) $(if $(FORTIO),MESHWIRE_CLUSTER_FORTIO=$(FORTIO)) \
	$(if $(POD_CGROUPS),MESHWIRE_CLUSTER_POD_CGROUPS=$(POD_CGROUPS))
cluster:
	$(CLUSTER_ENV) test/cluster/cluster.sh up

cluster-down:
	test/cluster/cluster.sh down

# The suites against the running cluster (test/clustersuites, Go tests
# built with the cluster tag); those that compare fresh clusters
# (conformance, network-suite, podstart-compare) take clusters of NODES
# nodes up and down themselves.
CLUSTER_TIMEOUT ?= 240m
CLUSTER_SUITE = $(CLUSTER_ENV) $(GO) test -tags cluster -count=1 -v -timeout $(CLUSTER_TIMEOUT) ./test/clustersuites/ -run

# Services, DNS and per-pod interception; across nodes on several.
cluster-smoke:
	$(CLUSTER_SUITE) '^TestSmoke$$'

# Kubernetes' e2e suite against the running cluster: sig-network
# conformance (45 specs), or E2E_FOCUS (with E2E_SKIP, and E2E_SPECS, the
# number of specs it must run).
cluster-e2e:
	E2E_FOCUS='$(E2E_FOCUS)' E2E_SKIP='$(E2E_SKIP)' E2E_SPECS='$(E2E_SPECS)' $(CLUSTER_SUITE) '^TestE2E$$'

# Istio-annotated pods in REDIRECT, TPROXY and EBPF behind Services, with the
# fast path, across a rollout of a new meshwire image; servers and callers
# on different nodes; over IPv6 too on a dual-stack cluster (IP_FAMILY=dual).
cluster-mesh:
	$(CLUSTER_SUITE) '^TestMesh$$'

# Istio ambient mode through the API server: the agent with --ambient, a
# ztunnel stand-in (test/proxy -zds) per node, pods enrolled and
# unenrolled by their namespace's label (docs/ambient.md); over IPv6 too on
# a dual-stack cluster.
cluster-ambient:
	$(CLUSTER_SUITE) '^TestAmbient$$'

# Ambient mode, agent against agent (one node): istio-cni's node agent in
# ambient mode (its chart's ambient profile) and meshwire's with --ambient,
# each on a fresh cluster (AMBCMP_LEGS, "istio-cni meshwire"), each serving
# the same ztunnel stand-in: 20 running pods enrolled by their namespace's
# label, their rules compared, the agent restarted under traffic, 20 pods
# created enrolled before their first connection. The report in
# $$MESHWIRE_CLUSTER_E2E_REPORT/ambient-compare.
cluster-ambient-compare:
	AMBCMP_LEGS='$(AMBCMP_LEGS)' $(CLUSTER_SUITE) '^TestAmbientCompare$$'

# 30 pods at once, create to Ready (PODSTART_PODS, PODSTART_ROUNDS).
cluster-podstart:
	$(CLUSTER_SUITE) '^TestPodStart$$'

# Pod start on meshwire and on the reference plugins v1.9.1, fresh clusters
# in the order meshwire, reference, reference, meshwire, judged against
# the targets of docs/kubernetes.md.
cluster-podstart-compare:
	$(CLUSTER_SUITE) '^TestPodStartCompare$$'

# sig-network conformance (45 specs) on meshwire, then on the reference
# plugins v1.9.1 (the control), each cluster taken down with its leak
# checks.
cluster-conformance:
	$(CLUSTER_SUITE) '^TestConformance$$'

# Kubernetes' [Feature:IPv6DualStack] specs on fresh dual-stack clusters,
# meshwire then the reference plugins v1.9.1 (the control): 9 specs on
# one node, 22 on two or more (NODES).
cluster-dualstack: IP_FAMILY = dual
cluster-dualstack:
	$(CLUSTER_SUITE) '^TestDualStack$$'

# The broad sig-network suite on meshwire and on the control: fails when
# meshwire fails a spec the control passes.
cluster-network-suite:
	$(CLUSTER_SUITE) '^TestNetworkSuite$$'

# containerd 2 gating the node on meshwire's CNI STATUS (RUNTIME=containerd2).
cluster-status:
	$(CLUSTER_SUITE) '^TestStatusGate$$'

# containerd 2 calls STATUS but not GC: `meshwire gc --cri-socket` against
# the sandboxes containerd lists collects an attachment whose DEL was lost
# and keeps one whose ADD just ended (RUNTIME=containerd2;
# RUNTIME_GC_BREAK=min-age-0: the deliberate break, which must fail).
cluster-runtime-gc: build
	RUNTIME_GC_BREAK='$(RUNTIME_GC_BREAK)' $(CLUSTER_SUITE) '^TestRuntimeGC$$'

# The same pods on a fresh istio-cni cluster, then on a fresh meshwire one
# (REDIRECT and TPROXY sidecar pods, and init-container pods run by
# meshwire's iptables-init and Istio's pilot-agent istio-iptables): their
# rules, read from the node, must be the same. The readings are kept in
# $$MESHWIRE_CLUSTER_E2E_REPORT/istio-rules (ISTIO_RULES_LEGS=meshwire: a
# meshwire cluster against the istio-cni readings stored there).
cluster-istio-rules:
	ISTIO_RULES_LEGS='$(ISTIO_RULES_LEGS)' $(CLUSTER_SUITE) '^TestIstioRules$$'

# kube-apiserver stopped for 60 s as kubelet starts 10 sidecar pods'
# sandboxes, on a fresh one-node cluster per network (APIAWAY_LEGS,
# "meshwire istio-cni"): who gets its network while the API server is away.
cluster-apiserver-away:
	APIAWAY_LEGS='$(APIAWAY_LEGS)' $(CLUSTER_SUITE) '^TestAPIServerAway$$'

# Sidecar pods (REDIRECT) on fresh clusters, istio-cni, meshwire, meshwire,
# istio-cni: PODSTART_PODS (30) at once, PODSTART_ROUNDS (3) rounds,
# create to Ready; each chained plugin's own ADD time from its log on the
# node; the API server's requests per pod by user agent (its audit log).
# Judged against the targets of docs/kubernetes.md; the report in
# $$MESHWIRE_CLUSTER_E2E_REPORT/istio-podstart.
cluster-istio-podstart:
	$(CLUSTER_SUITE) '^TestIstioPodStartCompare$$'

# Request latency as Kmesh measures it: fortio v1.67.1 client and echo
# server pods through a ClusterIP Service, 64 B and 4 KiB, 1,000 qps and
# the maximum, on a fresh cluster per network (LATENCY_LEGS, "meshwire
# istio-cni"): no mesh, REDIRECT with the sidecar, with the fast path, EBPF
# with the fast path, ambient with the ztunnel stand-in, and istio-cni's
# REDIRECT; same node, and across nodes with NODES >= 2. LATENCY_ROUNDS
# (2), LATENCY_DURATION (10s), LATENCY_CONNECTIONS (4), LATENCY_IDLE_POLL
# (1: every load with the machine's idle CPUs held polling; both: each
# load both ways, not judged). Fails when the
# fast path takes less than 30 % off the sidecar's added p50 at 1,000 qps,
# same node. The report in $$MESHWIRE_CLUSTER_E2E_REPORT/latency.
cluster-latency: FORTIO = 1
cluster-latency:
	LATENCY_LEGS='$(LATENCY_LEGS)' $(CLUSTER_SUITE) '^TestLatency$$'

# The fast path's counters per node for a client on the server's node and
# one on another (on the running cluster, NODES >= 2, started FORTIO=1).
cluster-fastpath-placement:
	$(CLUSTER_SUITE) '^TestFastpathPlacement$$'

# A node's power cut and return, and a node removed for good (NODES >= 2).
cluster-faults:
	$(CLUSTER_SUITE) '^TestNodeFaults$$'

# cri-tools' critest networking specs against a containerd of its own with
# meshwire's plugins (CRITEST_PLUGINS="meshwire reference": then with the
# reference v1.9.1's; CRITEST_FOCUS: other specs). Not part of `make test`.
CRITEST_PLUGINS ?= meshwire
CRITEST_FOCUS ?=
critest: build
	CRITEST_FOCUS='$(CRITEST_FOCUS)' test/cluster/critest.sh $(CRITEST_PLUGINS)

clean:
	rm -rf $(BIN)
