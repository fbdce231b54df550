package ipamexec

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// fakeIPAM installs a shell-script IPAM plugin named "fake" on CNI_PATH that
// records the command it got and answers as MODE (in the config) says.
func fakeIPAM(t *testing.T) (record string) {
	t.Helper()
	dir := t.TempDir()
	record = filepath.Join(dir, "record")
	script := `#!/bin/sh
conf=$(cat)
echo "$CNI_COMMAND $KEEP" >> ` + record + `
case "$conf" in
*'"mode":"error"'*) echo '{"cniVersion":"1.0.0","code":11,"msg":"busy","details":"try later"}'; exit 1 ;;
*'"mode":"stderr"'*) echo 'it broke' >&2; exit 3 ;;
*'"mode":"silent"'*) exit 4 ;;
*'"mode":"text"'*) echo 'no luck today'; exit 5 ;;
*'"mode":"noversion"'*) echo '{"ips":[{"address":"198.18.95.3/24"}]}'; exit 0 ;;
*'"mode":"older"'*) echo '{"cniVersion":"0.4.0","ips":[{"version":"4","address":"198.18.95.4/24"}]}'; exit 0 ;;
esac
[ "$CNI_COMMAND" = ADD ] && echo '{"cniVersion":"1.0.0","ips":[{"address":"198.18.95.2/24","gateway":"198.18.95.1"}]}'
exit 0
`
	if err := os.WriteFile(filepath.Join(dir, "fake"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CNI_PATH", "/nonexistent"+string(os.PathListSeparator)+dir)
	t.Setenv("CNI_COMMAND", "DEL") // the caller's own command, replaced for the delegate
	t.Setenv("KEEP", "kept")
	return record
}

func conf(mode string) []byte {
	return []byte(`{"cniVersion":"1.0.0","name":"n","type":"bridge","ipam":{"type":"fake","mode":"` + mode + `"}}`)
}

func TestDelegation(t *testing.T) {
	record := fakeIPAM(t)
	ctx := context.Background()
	res, release, err := Add(ctx, "fake", conf("ok"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "198.18.95.2/24" {
		t.Fatalf("result %+v", res)
	}
	release()
	for _, fn := range []func(context.Context, string, []byte) error{Check, Status, GC} {
		if err := fn(ctx, "fake", conf("ok")); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(record)
	if want := "ADD kept\nDEL kept\nCHECK kept\nSTATUS kept\nGC kept\n"; string(got) != want {
		t.Fatalf("commands seen by the plugin:\n%s\nwant\n%s", got, want)
	}
}

func TestDelegationErrors(t *testing.T) {
	fakeIPAM(t)
	ctx := context.Background()
	err := Del(ctx, "fake", conf("error"))
	if cnierr.Code(err) != 11 || !strings.Contains(err.Error(), "busy") || !strings.Contains(err.Error(), `ipam "fake" DEL`) {
		t.Fatalf("plugin's CNI error: %v (code %d)", err, cnierr.Code(err))
	}
	if err := Check(ctx, "fake", conf("stderr")); cnierr.Code(err) != 999 || !strings.Contains(err.Error(), "it broke") {
		t.Fatalf("stderr failure: %v (code %d)", err, cnierr.Code(err))
	}
	if err := GC(ctx, "fake", conf("silent")); cnierr.Code(err) != 999 || !strings.Contains(err.Error(), "exit status 4") {
		t.Fatalf("silent failure: %v (code %d)", err, cnierr.Code(err))
	}
	if err := GC(ctx, "fake", conf("text")); cnierr.Code(err) != 999 || !strings.Contains(err.Error(), "no luck today") {
		t.Fatalf("failure with plain text on stdout: %v (code %d)", err, cnierr.Code(err))
	}
	if _, _, err := Add(ctx, "missing", conf("ok")); err == nil || !strings.Contains(err.Error(), `failed to find plugin "missing"`) {
		t.Fatalf("missing plugin: %v", err)
	}
	if err := Status(ctx, "missing", conf("ok")); cnierr.Code(err) != 50 {
		t.Fatalf("STATUS of a missing plugin: %v (code %d), want 50", err, cnierr.Code(err))
	}
	if _, _, err := Add(ctx, "../fake", conf("ok")); err == nil {
		t.Fatal("a plugin name with a path was run")
	}
}

// TestResultVersions: as with libcni, a result is read with its own
// cniVersion, and with the config's when it has none.
func TestResultVersions(t *testing.T) {
	fakeIPAM(t)
	for mode, want := range map[string]string{"noversion": "198.18.95.3/24", "older": "198.18.95.4/24"} {
		res, release, err := Add(context.Background(), "fake", conf(mode))
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		release()
		if len(res.IPs) != 1 || res.IPs[0].Address.String() != want {
			t.Fatalf("%s: result %+v", mode, res)
		}
	}
}
