package firewall

import "testing"

func TestIsNFTTool(t *testing.T) {
	for base, want := range map[string]bool{
		"xtables-nft-multi": true, "iptables-nft-restore": true,
		"xtables-legacy-multi": false, "iptables-restore": false, "": false,
	} {
		if got := isNFTTool(base); got != want {
			t.Errorf("isNFTTool(%q) = %v, want %v", base, got, want)
		}
	}
}

func TestNFTablesBacked(t *testing.T) {
	if !(Backend{Kind: IPTables, Variant: VariantNFT}).NFTablesBacked() ||
		(Backend{Kind: IPTables, Variant: VariantLegacy}).NFTablesBacked() || (Backend{Kind: NFTables}).NFTablesBacked() {
		t.Fatal("NFTablesBacked misclassifies the explicit backends")
	}
}
