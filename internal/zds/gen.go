// Package zds is Istio's ztunnel discovery service (ZDS): the hand-off of
// enrolled pods' network namespaces from the node agent to ztunnel over a
// Unix SOCK_SEQPACKET socket (nodelayout.ZtunnelSocket). The agent
// (`meshwire node`, as istio-cni's agent) is the server; ztunnel connects,
// says ZdsHello, and is sent one message at a time, each acknowledged
// before the next:
//
//   - on every connection, a snapshot: AddWorkload per enrolled pod with
//     its netns file descriptor (SCM_RIGHTS), or KeepWorkload when its
//     netns cannot be opened, then SnapshotSent;
//   - then AddWorkload as pods are enrolled (to the newest connection)
//     and DelWorkload as they go (to every connection).
//
// Server is the agent's side (istio-cni's cni/pkg/nodeagent/
// ztunnelserver.go), Client is ztunnel's, for meshwire's ztunnel stand-in
// (test/proxy -zds) and tests.
//
// The message types in zds.pb.go are generated from Istio's
// pkg/zdsapi/zds.proto, copied here unchanged (Istio 1.30, the
// istio.io/istio module version test/istio pins). They are generated
// rather than imported from istio.io/istio/pkg/zdsapi because requiring
// that module raises meshwire's own requirements through minimal version
// selection (google.golang.org/grpc 1.72 to 1.82, k8s.io/api and
// k8s.io/apimachinery 0.34 to 0.36, and more): a wire format of seven
// messages is not worth that. The comment protoc-gen-go copies from the
// proto's package line is taken out after generation, so that this
// file's is the package's only doc comment (the generated file's license
// header is separated from its package clause). Regenerate with protoc
// and protoc-gen-go at go.mod's google.golang.org/protobuf version:
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
package zds

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go_opt=Mzds.proto=github.com/meshwire/meshwire/internal/zds;zds zds.proto
//go:generate sed -i -e "/^\/\/ GRPC package - part of the URL/,/^\/\/ URL:/d" zds.pb.go
