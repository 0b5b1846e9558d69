cd /workspace/receipts
mkdir -p 2023-07 && mv scan_1526_10.txt 2023-07/
mkdir -p 2023-07 && mv scan_2328_05.txt 2023-07/
mkdir -p 2023-09 && mv scan_4436_02.txt 2023-09/
mkdir -p 2023-06 && mv scan_4498_03.txt 2023-06/
mkdir -p 2023-07 && mv scan_4574_07.txt 2023-07/
mkdir -p 2023-07 && mv scan_6398_06.txt 2023-07/
mkdir -p 2023-09 && mv scan_6480_08.txt 2023-09/
mkdir -p 2023-07 && mv scan_7518_04.txt 2023-07/
mkdir -p 2023-06 && mv scan_7559_00.txt 2023-06/
mkdir -p 2023-07 && mv scan_9121_01.txt 2023-07/
mkdir -p 2023-09 && mv scan_9918_09.txt 2023-09/
mkdir -p .
cat > index.csv <<'ORCHARD_EOF'
month,count,total
2023-06,2,119.78
2023-07,6,426.30
2023-09,3,220.43
ORCHARD_EOF
