package framework

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// Lifecycle takes clusters up and down with cluster.sh, for the suites
// that compare fresh clusters (meshwire's against the control's).
type Lifecycle struct {
	Repo  string
	Nodes int
	// Logs is the directory of each up's and down's output.
	Logs string
	// Env is more of cluster.sh's settings for each up
	// (MESHWIRE_CLUSTER_...=...).
	Env []string
}

// Up starts a cluster whose network is cni (meshwire or reference);
// name labels its log.
func (l Lifecycle) Up(cni, name string) error { return l.run(name+"-up", cni, "up") }

// Down takes the running cluster down; its leak checks decide the error.
func (l Lifecycle) Down(name string) error { return l.run(name+"-down", "", "down") }

func (l Lifecycle) run(log, cni, verb string) error {
	if err := os.MkdirAll(l.Logs, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(l.Logs, log+".log"))
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(ScriptPath(l.Repo), verb)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), "MESHWIRE_CLUSTER_NODES="+strconv.Itoa(l.Nodes))
	if cni != "" {
		cmd.Env = append(append(cmd.Env, "MESHWIRE_CLUSTER_CNI="+cni), l.Env...)
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cluster.sh %s: %v (log: %s)", verb, err, f.Name())
	}
	return nil
}

// Running says whether a cluster runs, and its description.
func Running() (*Cluster, bool) {
	c, err := LoadCluster()
	return c, err == nil
}
